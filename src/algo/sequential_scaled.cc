// The sequential algorithm for the scaled ops: the collective, then cuBLASLt's fp8 GEMM with the
// scales applied in it (gemm::GemmRunner::run_scaled).
#include "algo/bytes.h"
#include "algo/resources.h"
#include "algo/scaled_work.h"
#include "algo/sequential.h"
#include "comm/communicator_impl.h"
#include "common/check.h"
#include "common/element.h"
#include "kernels/sum_partials.h"

namespace asynctp::algo {
namespace {

gemm::Problem scaled_problem(const Scaling& s, DType a_dtype, DType out_dtype, int64_t M, int64_t N, int64_t K) {
  gemm::Problem p;
  p.M = M, p.N = N, p.K = K;
  p.dtype = a_dtype;
  return scaled(p, ScaledWork::of(s, nullptr, out_dtype));
}

const float* floats(const TensorRef& t) { return static_cast<const float*>(t.data); }

gemm::ScaledPointers pointers(const float* a_scale, const float* b_scale, const ScaledEpilogue& e) {
  return gemm::ScaledPointers{a_scale, b_scale, e.bias.data, floats(e.result_scale)};
}

}  // namespace

void sequential_all_gather_scaled_matmul(Communicator& comm, const AllGatherMatmulPlan& plan, const TensorRef& a_shard,
                                         const std::vector<TensorRef>& bs, const TensorRef& a_scale,
                                         const std::vector<TensorRef>& b_scales, const std::vector<TensorRef>& outputs,
                                         const TensorRef& gathered_a, const std::vector<ScaledEpilogue>& epilogues,
                                         cudaStream_t stream, const AgreeFn& agree) {
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
    const gemm::Problem p = scaled_problem(plan.scaling, plan.dtype, plan.scaling.out_dtype, plan.M, plan.N[i], plan.K);
    runner.run_scaled(p, gathered, bs[i].data, pointers(a_scales, floats(b_scales[i]), epilogues[i]), outputs[i].data,
                      stream);
  }
}

void sequential_scaled_matmul_reduce_scatter(Communicator& comm, const MatmulReduceScatterPlan& plan,
                                             const TensorRef& a, const TensorRef& b, const TensorRef& a_scale,
                                             const TensorRef& b_scale, const TensorRef& output,
                                             const ScaledEpilogue& epilogue, cudaStream_t stream, const AgreeFn& agree) {
  ASYNCTP_CHECK(plan.scaling.scaled, "sequential_scaled_matmul_reduce_scatter: the plan is not scaled");
  Communicator::Impl& m = impl_of(comm);
  gemm::GemmRunner& runner = Resources::of(comm).gemm;
  // The partial product in the output's dtype, reduced by the transport in it (as the unscaled op's);
  // one rank's is its output, written after the check. An fp8 output's partials are bf16, reduced in
  // bf16 and rounded to fp8 with the result scale after.
  const bool alone = m.world_size == 1;
  const DType partial_dtype = alone ? plan.scaling.out_dtype : plan.scaling.partial_dtype();
  const bool requantize = partial_dtype != plan.scaling.out_dtype;
  const size_t es = dtype_size(partial_dtype);
  const size_t out_elems = static_cast<size_t>(plan.out_rows) * plan.out_cols;
  if (alone) agree();
  char* partial = alone ? bytes(output.data)
                        : static_cast<char*>(m.scratch_for(align_up(static_cast<size_t>(plan.M) * plan.N * es) +
                                                               (requantize ? out_elems * es : 0),
                                                           stream));
  // Each rank's partial carries the bias (the reduction then counts it once a rank); the result scale
  // applies to the output, not to the partials.
  ScaledEpilogue partial_epilogue = epilogue;
  if (requantize) partial_epilogue.result_scale = TensorRef{};
  if (!plan.scatter_last) {
    const gemm::Problem p = scaled_problem(plan.scaling, plan.dtype, partial_dtype, plan.M, plan.N, plan.k_local);
    runner.run_scaled(p, a.data, b.data, pointers(floats(a_scale), floats(b_scale), partial_epilogue), partial, stream);
  } else {
    // Laid out [world][M][N/world], one GEMM per destination rank on its columns: B's rows [r*n, (r+1)*n)
    // (B is [N, K/world]) and, row-wise, b_scale's and the bias's entries alike.
    const int64_t n = plan.out_cols;
    gemm::Problem p = scaled_problem(plan.scaling, plan.dtype, partial_dtype, plan.M, n, plan.k_local);
    p.ldb = plan.k_local;
    p.ldc = n;
    const size_t b_es = dtype_size(plan.scaling.b_dtype);
    const size_t bias_es = dtype_size(gemm::bias_dtype(plan.scaling.out_dtype));
    for (int r = 0; r < m.world_size; ++r) {
      const size_t col0 = static_cast<size_t>(r) * n;
      gemm::ScaledPointers ptrs = pointers(floats(a_scale), floats(b_scale) + (plan.scaling.rowwise ? col0 : 0),
                                           partial_epilogue);
      if (ptrs.bias != nullptr) ptrs.bias = bytes(ptrs.bias) + col0 * bias_es;
      runner.run_scaled(p, a.data, bytes(b.data) + col0 * plan.k_local * b_es, ptrs,
                        partial + static_cast<size_t>(r) * plan.M * n * es, stream);
    }
  }
  if (alone) return;
  agree();  // the partial GEMM above runs on the GPU meanwhile; it wrote only scratch
  bound_captured_collective(comm, stream);
  if (!requantize) {
    m.transport->reduce_scatter(partial, output.data, out_elems, partial_dtype, plan.reduce_op, stream);
    return;
  }
  char* reduced = partial + align_up(static_cast<size_t>(plan.M) * plan.N * es);
  m.transport->reduce_scatter(partial, reduced, out_elems, partial_dtype, plan.reduce_op, stream);
  kernels::sum_partials_to(element_of(partial_dtype), {reduced}, element_of(plan.scaling.out_dtype), output.data,
                           static_cast<int64_t>(out_elems), 1.0f, floats(epilogue.result_scale), stream);
}

}  // namespace asynctp::algo
