// The scaled ops' own rules (asynctp/scaled_ops.h); the shapes they share with the unscaled ops are
// checked by the same planner (plan.cc, plan_typed.h).
#include <string>

#include "common/check.h"
#include "gemm/cublaslt_gemm.h"
#include "ops/plan.h"
#include "ops/plan_typed.h"

namespace asynctp::ops {
namespace {

using detail::cat;

constexpr const char* kScaledDtypes = "the scaled ops take fp8 A and B and give bf16, fp16 or fp8 e4m3 outputs";

bool is_fp8(DType t) { return t == DType::kFP8E4M3 || t == DType::kFP8E5M2; }

void check_scaled_options(const char* op, const ScaledOpOptions& options) {
  ASYNCTP_CHECK(options.b_layout == BLayout::kColMajor, op,
                ": options.b_layout is row-major; the scaled ops need B column-major ([N, K], K contiguous), as "
                "cuBLASLt's fp8 GEMMs do");
}

void check_fp8_pair(const char* op, const char* a_name, DType a, const char* b_name, DType b) {
  ASYNCTP_CHECK(is_fp8(a), op, ": ", a_name, " is ", dtype_name(a), "; expected fp8 e4m3 or e5m2 (", kScaledDtypes, ")");
  ASYNCTP_CHECK(is_fp8(b), op, ": ", b_name, " is ", dtype_name(b), "; expected fp8 e4m3 or e5m2 (", kScaledDtypes, ")");
  ASYNCTP_CHECK(!(a == DType::kFP8E5M2 && b == DType::kFP8E5M2), op, ": ", a_name, " and ", b_name,
                " are both fp8 e5m2; cuBLASLt has no e5m2 x e5m2 GEMM: make one of them e4m3");
}

DType output_dtype(const char* op, const char* name, const TensorRef& out) {
  ASYNCTP_CHECK(out.dtype == DType::kBF16 || out.dtype == DType::kFP16 || out.dtype == DType::kFP8E4M3, op, ": ", name,
                " is ", dtype_name(out.dtype), "; expected bf16, fp16 or fp8 e4m3 (", kScaledDtypes, ")");
  return out.dtype;
}

void check_multiple_of_16(const char* op, const char* what, int64_t value, const std::string& from) {
  ASYNCTP_CHECK(value % 16 == 0, op, ": ", what, " is ", value, " (", from,
                "); fp8 GEMMs need it to be a multiple of 16");
}

// One fp32 scale tensor: dense, aligned, on the GPU (checked with the others); `count` elements, as
// [count], [count, 1] (column) or [1, count] (row).
enum class ScaleShape { kColumn, kRow };

void check_scale(const char* op, const std::string& name, const TensorRef& s, int64_t count, ScaleShape shape) {
  ASYNCTP_CHECK(s.defined() && s.data != nullptr, op, ": ", name, " is missing; expected an fp32 scale tensor");
  ASYNCTP_CHECK(s.dtype == DType::kFP32, op, ": ", name, " is ", dtype_name(s.dtype), "; expected fp32");
  ASYNCTP_CHECK(s.ndim >= 0 && s.ndim <= 2, op, ": ", name, " has ", s.ndim, " dims; expected at most 2");
  ASYNCTP_CHECK(s.is_dense(), op, ": ", name, " is not dense; expected a contiguous tensor");
  ASYNCTP_CHECK(reinterpret_cast<uintptr_t>(s.data) % 16 == 0, op, ": ", name, " data pointer ", s.data,
                " is not 16-byte aligned; expected 16-byte alignment");
  const bool shape_ok = count == 1 ? s.numel() == 1
                                   : (s.ndim == 1 && s.shape[0] == count) ||
                                         (s.ndim == 2 && shape == ScaleShape::kColumn && s.shape[0] == count &&
                                          s.shape[1] == 1) ||
                                         (s.ndim == 2 && shape == ScaleShape::kRow && s.shape[0] == 1 &&
                                          s.shape[1] == count);
  ASYNCTP_CHECK(shape_ok, op, ": ", name, " has shape ", shape_string(s), "; expected ",
                count == 1 ? std::string("one element (tensor-wise)")
                           : cat(shape == ScaleShape::kColumn ? cat("[", count, ", 1]") : cat("[1, ", count, "]"),
                                 " or [", count, "] (row-wise)"));
}

bool tensor_wise(const TensorRef& s) { return s.defined() && s.numel() == 1; }

// An optional bias over the output's N columns: [N], in the output's dtype (bf16 for fp8 outputs).
void check_bias(const char* op, const std::string& name, const TensorRef& bias, int64_t n, DType out) {
  if (!bias.defined()) return;
  const DType want = gemm::bias_dtype(out);
  ASYNCTP_CHECK(bias.data != nullptr, op, ": ", name, " has no data; expected a [", n, "] tensor or none");
  ASYNCTP_CHECK(bias.dtype == want, op, ": ", name, " is ", dtype_name(bias.dtype), "; expected ", dtype_name(want),
                out == want ? " (the output's dtype)" : " (the bias of an fp8 output is bf16)");
  ASYNCTP_CHECK(bias.ndim == 1 && bias.shape[0] == n, op, ": ", name, " has shape ", shape_string(bias), "; expected [",
                n, "] (one value per output column)");
  ASYNCTP_CHECK(bias.is_dense(), op, ": ", name, " is not dense; expected a contiguous tensor");
  ASYNCTP_CHECK(reinterpret_cast<uintptr_t>(bias.data) % 16 == 0, op, ": ", name, " data pointer ", bias.data,
                " is not 16-byte aligned; expected 16-byte alignment");
}

// An optional result scale: one fp32 element, for an fp8 output only, with tensor-wise scales.
void check_result_scale(const char* op, const std::string& name, const TensorRef& s, DType out) {
  if (!s.defined()) return;
  ASYNCTP_CHECK(out == DType::kFP8E4M3, op, ": ", name, " is given but the output is ", dtype_name(out),
                "; a result scale is for fp8 outputs only");
  check_scale(op, name, s, 1, ScaleShape::kRow);
}

// fp8 outputs take tensor-wise scales (cuBLASLt's row-wise fp8 GEMMs give 16-bit outputs).
void check_fp8_output_scales(const char* op, DType out, bool rowwise) {
  ASYNCTP_CHECK(!(out == DType::kFP8E4M3 && rowwise), op, ": the output is fp8 e4m3 with row-wise scales; expected "
                "tensor-wise scales for an fp8 output, or a bf16 or fp16 output for row-wise ones");
}

}  // namespace

AllGatherMatmulPlan plan_all_gather_scaled_matmul(int world_size, const TensorRef& a,
                                                  const std::vector<TensorRef>& bs, const TensorRef& a_scale,
                                                  const std::vector<TensorRef>& b_scales, int gather_dim,
                                                  const std::vector<TensorRef>& outputs, const TensorRef& gathered_a,
                                                  const std::vector<algo::ScaledEpilogue>& epilogues,
                                                  const ScaledOpOptions& options) {
  const char* op = "all_gather_scaled_matmul";
  ASYNCTP_CHECK(world_size >= 1, op, ": world size must be >= 1, got ", world_size);
  check_options(op, options);
  check_scaled_options(op, options);
  ASYNCTP_CHECK(!bs.empty(), op, ": bs is empty; expected one or more B");
  ASYNCTP_CHECK(!outputs.empty(), op, ": outputs is empty; expected one output per B");
  check_fp8_pair(op, "a_shard", a.dtype, "bs[0]", bs[0].dtype);
  const DType out = output_dtype(op, "outputs[0]", outputs[0]);
  AllGatherMatmulPlan p = plan_typed_all_gather_matmul(op, world_size, a, bs, gather_dim, outputs, gathered_a, options,
                                                       Dtypes{a.dtype, bs[0].dtype, out, kScaledDtypes});
  check_multiple_of_16(op, "K", p.K, p.gather_last ? "a_shard's last dim x world size" : "a_shard's last dim");
  for (size_t i = 0; i < bs.size(); ++i) check_multiple_of_16(op, "N", p.N[i], cat("bs[", i, "]'s N"));

  ASYNCTP_CHECK(b_scales.size() == bs.size(), op, ": got ", bs.size(), " B(s) but ", b_scales.size(),
                " b_scale(s); expected one b_scale per B");
  // Row-wise where either scale is a vector (a one-row A's row-wise scale has one element).
  const bool rowwise = (a_scale.defined() && !tensor_wise(a_scale)) || (b_scales[0].defined() && !tensor_wise(b_scales[0]));
  // Row-wise, a_scale holds this rank's rows' scales ([m, 1], gathered with the rows) or every row's
  // ([M, 1], as PyTorch's async-TP pass passes it: nothing is gathered). Gathered along K, every rank
  // holds every row already.
  const bool every_row = p.gather_last || (a_scale.defined() && a_scale.numel() == p.M && p.M != p.m_local);
  check_scale(op, "a_scale", a_scale, rowwise ? (every_row ? p.M : p.m_local) : 1, ScaleShape::kColumn);
  for (size_t i = 0; i < b_scales.size(); ++i) {
    const std::string name = cat("b_scales[", i, "]");
    ASYNCTP_CHECK(!b_scales[i].defined() || p.N[i] == 1 || tensor_wise(b_scales[i]) != rowwise, op, ": a_scale is ",
                  rowwise ? "row-wise" : "tensor-wise", " but ", name, " is ", rowwise ? "tensor-wise" : "row-wise",
                  "; expected both tensor-wise or both row-wise");
    check_scale(op, name, b_scales[i], rowwise ? p.N[i] : 1, ScaleShape::kRow);
  }
  check_fp8_output_scales(op, out, rowwise);
  ASYNCTP_CHECK(epilogues.size() == bs.size(), op, ": ", epilogues.size(), " epilogues for ", bs.size(), " Bs");
  bool any_bias = false;
  for (size_t i = 0; i < bs.size(); ++i) {
    check_bias(op, cat("biases[", i, "]"), epilogues[i].bias, p.N[i], out);
    check_result_scale(op, cat("result_scales[", i, "]"), epilogues[i].result_scale, out);
    any_bias = any_bias || epilogues[i].bias.defined();
  }
  p.scaling = algo::Scaling{true, bs[0].dtype, out, rowwise, options.use_fast_accum, rowwise && !every_row, any_bias};
  return p;
}

MatmulReduceScatterPlan plan_scaled_matmul_reduce_scatter(int world_size, const TensorRef& a, const TensorRef& b,
                                                          const TensorRef& a_scale, const TensorRef& b_scale,
                                                          int scatter_dim, ReduceOp reduce_op, const TensorRef& output,
                                                          const algo::ScaledEpilogue& epilogue,
                                                          const ScaledOpOptions& options) {
  const char* op = "scaled_matmul_reduce_scatter";
  ASYNCTP_CHECK(world_size >= 1, op, ": world size must be >= 1, got ", world_size);
  check_options(op, options);
  check_scaled_options(op, options);
  ASYNCTP_CHECK(reduce_op == ReduceOp::kSum || reduce_op == ReduceOp::kAvg, op, ": reduce_op is ",
                static_cast<int>(reduce_op), "; expected sum (0) or avg (1)");
  check_fp8_pair(op, "a", a.dtype, "b", b.dtype);
  const DType out = output_dtype(op, "output", output);
  MatmulReduceScatterPlan p = plan_typed_matmul_reduce_scatter(op, world_size, a, b, scatter_dim, reduce_op, output,
                                                               options, Dtypes{a.dtype, b.dtype, out, kScaledDtypes});
  check_multiple_of_16(op, "K", p.k_local, "a's last dim");
  check_multiple_of_16(op, "N", p.scatter_last ? p.out_cols : p.N,
                       p.scatter_last ? "N / world size, each rank's columns" : "b's N");
  const bool rowwise = (a_scale.defined() && !tensor_wise(a_scale)) || (b_scale.defined() && !tensor_wise(b_scale));
  check_scale(op, "a_scale", a_scale, rowwise ? p.M : 1, ScaleShape::kColumn);
  ASYNCTP_CHECK(!b_scale.defined() || tensor_wise(b_scale) != rowwise, op, ": a_scale is ",
                rowwise ? "row-wise" : "tensor-wise", " but b_scale is ", rowwise ? "tensor-wise" : "row-wise",
                "; expected both tensor-wise or both row-wise");
  check_scale(op, "b_scale", b_scale, rowwise ? p.N : 1, ScaleShape::kRow);
  check_fp8_output_scales(op, out, rowwise);
  check_bias(op, "bias", epilogue.bias, p.N, out);
  check_result_scale(op, "result_scale", epilogue.result_scale, out);
  p.scaling = algo::Scaling{true, b.dtype, out, rowwise, options.use_fast_accum, false, epilogue.bias.defined()};
  return p;
}

std::vector<algo::ScaledEpilogue> scaled_epilogues(const char* op, size_t count, const std::vector<TensorRef>& biases,
                                               const std::vector<TensorRef>& result_scales) {
  ASYNCTP_CHECK(biases.empty() || biases.size() == count, op, ": got ", count, " B(s) but ", biases.size(),
                " bias(es); expected one per B (undefined for none), or an empty list");
  ASYNCTP_CHECK(result_scales.empty() || result_scales.size() == count, op, ": got ", count, " B(s) but ",
                result_scales.size(), " result scale(s); expected one per B (undefined for none), or an empty list");
  std::vector<algo::ScaledEpilogue> e(count);
  for (size_t i = 0; i < count; ++i) {
    if (!biases.empty()) e[i].bias = biases[i];
    if (!result_scales.empty()) e[i].result_scale = result_scales[i];
  }
  return e;
}

}  // namespace asynctp::ops
