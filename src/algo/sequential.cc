#include "algo/sequential.h"

#include "algo/bytes.h"
#include "algo/resources.h"
#include "comm/communicator_impl.h"
#include "common/check.h"

namespace asynctp::algo {

void bound_captured_collective(Communicator& comm, cudaStream_t stream) {
  Communicator::Impl& m = impl_of(comm);
  if (!m.transport->collectives_unbounded()) return;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  ASYNCTP_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  if (capture == cudaStreamCaptureStatusNone) return;
  m.enqueue_barrier(stream);
}

char* gather_a(Communicator& comm, const AllGatherMatmulPlan& plan, const TensorRef& a_shard,
               const TensorRef& gathered_a, size_t extra_bytes, char** extra, cudaStream_t stream) {
  Communicator::Impl& m = impl_of(comm);
  const size_t es = dtype_size(plan.dtype);
  const size_t gathered_bytes = static_cast<size_t>(plan.M) * plan.K * es;
  if (m.world_size == 1) {
    // One rank's shard is the whole A, in either gather dim: nothing to gather.
    if (extra != nullptr) *extra = extra_bytes ? static_cast<char*>(m.scratch_for(extra_bytes, stream)) : nullptr;
    if (!plan.return_a) return bytes(a_shard.data);
    ASYNCTP_CUDA_CHECK(
        cudaMemcpyAsync(gathered_a.data, a_shard.data, gathered_bytes, cudaMemcpyDeviceToDevice, stream));
    return bytes(gathered_a.data);
  }
  // Gather-last lands rank by rank ([world][M][K/world]) and is then interleaved into [M, K].
  const size_t staging_bytes = plan.gather_last ? gathered_bytes : 0;
  const size_t own = align_up(staging_bytes) + (plan.return_a ? 0 : align_up(gathered_bytes));
  const size_t scratch = own + extra_bytes;
  char* base = scratch ? static_cast<char*>(m.scratch_for(scratch, stream)) : nullptr;
  char* gathered = plan.return_a ? bytes(gathered_a.data) : base + align_up(staging_bytes);
  if (extra != nullptr) *extra = extra_bytes ? base + own : nullptr;
  const size_t shard_elems = static_cast<size_t>(plan.m_local) * plan.k_local;
  bound_captured_collective(comm, stream);
  if (!plan.gather_last) {
    m.transport->all_gather(a_shard.data, gathered, shard_elems * es, stream);
  } else {
    char* staging = base;
    m.transport->all_gather(a_shard.data, staging, shard_elems * es, stream);
    const size_t chunk = static_cast<size_t>(plan.k_local) * es;
    for (int r = 0; r < m.world_size; ++r) {
      ASYNCTP_CUDA_CHECK(cudaMemcpy2DAsync(gathered + r * chunk, plan.K * es, staging + r * shard_elems * es, chunk,
                                           chunk, plan.M, cudaMemcpyDeviceToDevice, stream));
    }
  }
  return gathered;
}

void sequential_all_gather_matmul(Communicator& comm, const AllGatherMatmulPlan& plan, const TensorRef& a_shard,
                                  const std::vector<TensorRef>& bs, const std::vector<TensorRef>& outputs,
                                  const TensorRef& gathered_a, cudaStream_t stream, const AgreeFn& agree) {
  agree();  // the all-gather comes first: nothing local to hide the check behind
  gemm::GemmRunner& runner = Resources::of(comm).gemm;
  const char* gathered = gather_a(comm, plan, a_shard, gathered_a, 0, nullptr, stream);
  for (size_t i = 0; i < bs.size(); ++i) {
    gemm::Problem p;
    p.M = plan.M;
    p.N = plan.N[i];
    p.K = plan.K;
    p.dtype = plan.dtype;
    p.b_layout = plan.b_layout;
    runner.run(p, gathered, bs[i].data, outputs[i].data, stream);
  }
}

void sequential_matmul_reduce_scatter(Communicator& comm, const MatmulReduceScatterPlan& plan, const TensorRef& a,
                                      const TensorRef& b, const TensorRef& output, cudaStream_t stream,
                                      const AgreeFn& agree) {
  Communicator::Impl& m = impl_of(comm);
  gemm::GemmRunner& runner = Resources::of(comm).gemm;
  const size_t es = dtype_size(plan.dtype);
  // One rank's partial product is its output (the average of one is itself), laid out alike; the
  // check comes first then, as the output is written.
  const bool alone = m.world_size == 1;
  if (alone) agree();
  char* partial = alone ? bytes(output.data)
                        : static_cast<char*>(m.scratch_for(static_cast<size_t>(plan.M) * plan.N * es, stream));
  gemm::Problem p;
  p.M = plan.M;
  p.K = plan.k_local;
  p.dtype = plan.dtype;
  p.b_layout = plan.b_layout;
  if (!plan.scatter_last) {
    p.N = plan.N;
    runner.run(p, a.data, b.data, partial, stream);
  } else {
    // The reduce-scatter scatters contiguous blocks, so the partial product is laid out [world][M][N/world]: one GEMM
    // per destination rank, on that rank's columns of B.
    const bool col = plan.b_layout == BLayout::kColMajor;
    const int64_t n = plan.out_cols;
    p.N = n;
    p.ldb = col ? plan.k_local : plan.N;
    p.ldc = n;
    for (int r = 0; r < m.world_size; ++r) {
      const size_t b_offset = static_cast<size_t>(r) * n * (col ? plan.k_local : 1);
      runner.run(p, a.data, bytes(b.data) + b_offset * es, partial + static_cast<size_t>(r) * plan.M * n * es, stream);
    }
  }
  if (alone) return;
  agree();  // the partial GEMM above runs on the GPU meanwhile; it wrote only scratch
  bound_captured_collective(comm, stream);
  const size_t out_elems = static_cast<size_t>(plan.out_rows) * plan.out_cols;
  m.transport->reduce_scatter(partial, output.data, out_elems, plan.dtype, plan.reduce_op, stream);
}

}  // namespace asynctp::algo
