// The sequential algorithm for the scaled ops: the collective, then cuBLASLt's fp8 GEMM with the
// scales applied in it (gemm::GemmRunner::run_scaled).
#include "algo/bytes.h"
#include "algo/resources.h"
#include "algo/scaled_work.h"
#include "algo/sequential.h"
#include "comm/communicator_impl.h"
#include "common/check.h"

namespace asynctp::algo {
namespace {

gemm::Problem scaled_problem(const Scaling& s, DType a_dtype, int64_t M, int64_t N, int64_t K) {
  gemm::Problem p;
  p.M = M, p.N = N, p.K = K;
  p.dtype = a_dtype;
  return scaled(p, ScaledWork::of(s, nullptr));
}

const float* floats(const TensorRef& t) { return static_cast<const float*>(t.data); }

}  // namespace

void sequential_all_gather_scaled_matmul(Communicator& comm, const AllGatherMatmulPlan& plan, const TensorRef& a_shard,
                                         const std::vector<TensorRef>& bs, const TensorRef& a_scale,
                                         const std::vector<TensorRef>& b_scales, const std::vector<TensorRef>& outputs,
                                         const TensorRef& gathered_a, cudaStream_t stream, const AgreeFn& agree) {
  ASYNCTP_CHECK(plan.scaling.scaled, "sequential_all_gather_scaled_matmul: the plan is not scaled");
  agree();  // the all-gather comes first: nothing local to hide the check behind
  gemm::GemmRunner& runner = Resources::of(comm).gemm;
  // Row-wise scales of this rank's rows only are gathered beside the rows: [world][m] is A's [M] order.
  // One rank's are every row's.
  const bool gather_scales = plan.scaling.rowwise && plan.scaling.gather_a_scale && comm.world_size() > 1;
  const size_t scale_bytes = gather_scales ? static_cast<size_t>(plan.M) * sizeof(float) : 0;
  char* gathered_scales = nullptr;
  const char* gathered = gather_a(comm, plan, a_shard, gathered_a, align_up(scale_bytes), &gathered_scales, stream);
  const float* a_scales = floats(a_scale);
  if (gather_scales) {
    impl_of(comm).transport->all_gather(a_scale.data, gathered_scales, static_cast<size_t>(plan.m_local) * sizeof(float),
                                        stream);
    a_scales = reinterpret_cast<const float*>(gathered_scales);
  }
  for (size_t i = 0; i < bs.size(); ++i) {
    const gemm::Problem p = scaled_problem(plan.scaling, plan.dtype, plan.M, plan.N[i], plan.K);
    runner.run_scaled(p, gathered, a_scales, bs[i].data, floats(b_scales[i]), outputs[i].data, stream);
  }
}

void sequential_scaled_matmul_reduce_scatter(Communicator& comm, const MatmulReduceScatterPlan& plan,
                                             const TensorRef& a, const TensorRef& b, const TensorRef& a_scale,
                                             const TensorRef& b_scale, const TensorRef& output, cudaStream_t stream,
                                             const AgreeFn& agree) {
  ASYNCTP_CHECK(plan.scaling.scaled, "sequential_scaled_matmul_reduce_scatter: the plan is not scaled");
  Communicator::Impl& m = impl_of(comm);
  gemm::GemmRunner& runner = Resources::of(comm).gemm;
  const DType out = plan.scaling.out_dtype;
  const size_t es = dtype_size(out);
  // The partial product in the output's dtype, reduced by the transport in it (as the unscaled op's);
  // one rank's is its output, written after the check.
  const bool alone = m.world_size == 1;
  if (alone) agree();
  char* partial = alone ? bytes(output.data)
                        : static_cast<char*>(m.scratch_for(static_cast<size_t>(plan.M) * plan.N * es, stream));
  if (!plan.scatter_last) {
    const gemm::Problem p = scaled_problem(plan.scaling, plan.dtype, plan.M, plan.N, plan.k_local);
    runner.run_scaled(p, a.data, floats(a_scale), b.data, floats(b_scale), partial, stream);
  } else {
    // Laid out [world][M][N/world], one GEMM per destination rank on its columns: B's rows [r*n, (r+1)*n)
    // (B is [N, K/world]) and, row-wise, b_scale's entries alike.
    const int64_t n = plan.out_cols;
    gemm::Problem p = scaled_problem(plan.scaling, plan.dtype, plan.M, n, plan.k_local);
    p.ldb = plan.k_local;
    p.ldc = n;
    const size_t b_es = dtype_size(plan.scaling.b_dtype);
    for (int r = 0; r < m.world_size; ++r) {
      const float* scales = floats(b_scale) + (plan.scaling.rowwise ? static_cast<size_t>(r) * n : 0);
      runner.run_scaled(p, a.data, floats(a_scale), bytes(b.data) + static_cast<size_t>(r) * n * plan.k_local * b_es,
                        scales, partial + static_cast<size_t>(r) * plan.M * n * es, stream);
    }
  }
  if (alone) return;
  agree();  // the partial GEMM above runs on the GPU meanwhile; it wrote only scratch
  bound_captured_collective(comm, stream);
  const size_t out_elems = static_cast<size_t>(plan.out_rows) * plan.out_cols;
  m.transport->reduce_scatter(partial, output.data, out_elems, out, plan.reduce_op, stream);
}

}  // namespace asynctp::algo
