// The scaled ops' validation rules (asynctp/scaled_ops.h): fp8 inputs, bf16, fp16 or fp8 e4m3 outputs,
// B column-major, K and N multiples of 16, tensor-wise or row-wise scales of the right shapes, biases
// and result scales, the sequential, pipelined and fused algorithms. Each refusal names the argument.
// No GPU needed.
#include <gtest/gtest.h>

#include <functional>

#include "asynctp/error.h"
#include "refusals.h"
#include "ops/plan.h"

namespace asynctp::ops {
namespace {

constexpr DType kE4M3 = DType::kFP8E4M3, kE5M2 = DType::kFP8E5M2, kBF16 = DType::kBF16, kFP32 = DType::kFP32;

void* fake(int i) { return reinterpret_cast<void*>(static_cast<uintptr_t>(0x10000000) * (i + 1)); }
TensorRef t(int i, std::initializer_list<int64_t> shape, DType d) { return TensorRef::dense(fake(i), d, shape); }
TensorRef scalar(int i) { return t(i, {1}, kFP32); }

using testing::error_of;

// a_shard [64, 128] on each of 2 ranks, B [256, 128] column-major.
AllGatherMatmulPlan ag(const TensorRef& a, const TensorRef& b, const TensorRef& a_scale, const TensorRef& b_scale,
                       const TensorRef& out, int dim = 0, ScaledOpOptions o = {}, algo::ScaledEpilogue e = {}) {
  return plan_all_gather_scaled_matmul(2, a, {b}, a_scale, {b_scale}, dim, {out}, TensorRef{}, {e}, o);
}

TEST(ScaledPlan, TensorWiseAndRowWiseGatherByRows) {
  const TensorRef a = t(0, {64, 128}, kE4M3), b = t(1, {256, 128}, kE4M3), out = t(2, {128, 256}, kBF16);
  const auto tw = ag(a, b, scalar(3), scalar(4), out);
  EXPECT_TRUE(tw.scaling.scaled);
  EXPECT_FALSE(tw.scaling.rowwise);
  EXPECT_EQ(tw.scaling.out_dtype, kBF16);
  EXPECT_EQ(tw.M, 128);
  EXPECT_EQ(tw.N, (std::vector<int64_t>{256}));
  const auto rw = ag(a, b, t(3, {64, 1}, kFP32), t(4, {1, 256}, kFP32), out);
  EXPECT_TRUE(rw.scaling.rowwise);
  EXPECT_TRUE(ag(a, b, t(3, {64}, kFP32), t(4, {256}, kFP32), out).scaling.rowwise);
  EXPECT_EQ(ag(a, t(1, {256, 128}, kE5M2), scalar(3), scalar(4), out).scaling.b_dtype, kE5M2);
  ScaledOpOptions fast;
  fast.use_fast_accum = true;
  EXPECT_TRUE(ag(a, b, scalar(3), scalar(4), out, 0, fast).scaling.fast_accum);
}

TEST(ScaledPlan, BadDtypesLayoutsAndAlgorithmsAreRefusedByName) {
  const TensorRef a = t(0, {64, 128}, kE4M3), b = t(1, {256, 128}, kE4M3), out = t(2, {128, 256}, kBF16);
  EXPECT_REFUSED(ag(t(0, {64, 128}, kBF16), b, scalar(3), scalar(4), out), "a_shard is bf16; expected fp8");
  EXPECT_REFUSED(ag(t(0, {64, 128}, kE5M2), t(1, {256, 128}, kE5M2), scalar(3), scalar(4), out), "e5m2 x e5m2");
  EXPECT_REFUSED(ag(a, b, scalar(3), scalar(4), t(2, {128, 256}, kFP32)), "outputs[0] is fp32; expected bf16, fp16 or fp8 e4m3");
  EXPECT_REFUSED(ag(a, b, scalar(3), scalar(4), t(2, {128, 256}, kE4M3)).M, "<no error>");
  EXPECT_REFUSED(ag(a, b, scalar(3), scalar(4), t(2, {128, 256}, DType::kFP16)).M, "<no error>");
  ScaledOpOptions row_major;
  row_major.b_layout = BLayout::kRowMajor;
  EXPECT_REFUSED(ag(a, t(1, {128, 256}, kE4M3), scalar(3), scalar(4), out, 0, row_major), "column-major");
  ScaledOpOptions fused;
  fused.algorithm = Algorithm::kFused;
  EXPECT_REFUSED(ag(a, b, scalar(3), scalar(4), out, 0, fused).M, "<no error>");  // the kernel's fp8 form, or pipelined
  ScaledOpOptions automatic, pipelined;
  automatic.algorithm = Algorithm::kAuto;
  pipelined.algorithm = Algorithm::kPipelined;
  EXPECT_REFUSED(ag(a, b, scalar(3), scalar(4), out, 0, automatic).M, "<no error>");
  EXPECT_REFUSED(ag(a, b, scalar(3), scalar(4), out, 0, pipelined).M, "<no error>");
}

TEST(ScaledPlan, KAndNMustBeMultiplesOf16) {
  EXPECT_REFUSED(ag(t(0, {64, 120}, kE4M3), t(1, {256, 120}, kE4M3), scalar(3), scalar(4), t(2, {128, 256}, kBF16)),
                 "K is 120");
  EXPECT_REFUSED(ag(t(0, {64, 128}, kE4M3), t(1, {250, 128}, kE4M3), scalar(3), scalar(4), t(2, {128, 250}, kBF16)),
                 "N is 250");
}

TEST(ScaledPlan, ScalesOfTheWrongKindShapeOrDtypeAreRefusedByName) {
  const TensorRef a = t(0, {64, 128}, kE4M3), b = t(1, {256, 128}, kE4M3), out = t(2, {128, 256}, kBF16);
  EXPECT_REFUSED(ag(a, b, TensorRef{}, scalar(4), out), "a_scale is missing");
  EXPECT_REFUSED(ag(a, b, t(3, {1}, kBF16), scalar(4), out), "a_scale is bf16; expected fp32");
  EXPECT_REFUSED(ag(a, b, t(3, {32, 1}, kFP32), t(4, {1, 256}, kFP32), out), "a_scale has shape [32, 1]; expected [64, 1]");
  EXPECT_REFUSED(ag(a, b, t(3, {64, 1}, kFP32), scalar(4), out), "b_scales[0] is tensor-wise");
  EXPECT_REFUSED(ag(a, b, scalar(3), t(4, {1, 256}, kFP32), out), "a_scale has shape [1]; expected [64, 1]");
  EXPECT_REFUSED(ag(a, b, t(3, {64, 1}, kFP32), t(4, {256, 1}, kFP32), out), "b_scales[0] has shape [256, 1]");
  EXPECT_REFUSED(plan_all_gather_scaled_matmul(2, a, {b}, scalar(3), {}, 0, {out}, TensorRef{}, {{}}, {}),
                 "expected one b_scale per B");
  EXPECT_FALSE(ag(t(0, {128, 64}, kE4M3), b, scalar(3), scalar(4), out, -1).scaling.rowwise);
}

// Row-wise, a_scale holds this rank's rows (gathered with them) or every row of the gathered A (as
// PyTorch's pass passes it); gathered along K, every rank holds every row.
TEST(ScaledPlan, RowWiseScalesOfThisRanksRowsOrOfEveryRow) {
  const TensorRef b = t(1, {256, 128}, kE4M3), out = t(2, {128, 256}, kBF16), sb = t(4, {1, 256}, kFP32);
  const TensorRef a = t(0, {64, 128}, kE4M3);
  EXPECT_TRUE(ag(a, b, t(3, {64, 1}, kFP32), sb, out).scaling.gather_a_scale);
  EXPECT_FALSE(ag(a, b, t(3, {128, 1}, kFP32), sb, out).scaling.gather_a_scale);
  const auto along_k = ag(t(0, {128, 64}, kE4M3), b, t(3, {128, 1}, kFP32), sb, out, -1);
  EXPECT_TRUE(along_k.scaling.rowwise);
  EXPECT_FALSE(along_k.scaling.gather_a_scale);
  EXPECT_REFUSED(ag(t(0, {128, 64}, kE4M3), b, t(3, {64, 1}, kFP32), sb, out, -1),
                 "a_scale has shape [64, 1]; expected [128, 1]");
}

TEST(ScaledPlan, ReduceScatter) {
  // a [128, 64] (K/world = 64 on each of 2 ranks), b [256, 64] column-major.
  const TensorRef a = t(0, {128, 64}, kE4M3), b = t(1, {256, 64}, kE4M3);
  const auto rows = plan_scaled_matmul_reduce_scatter(2, a, b, t(2, {128, 1}, kFP32), t(3, {1, 256}, kFP32), 0,
                                                      ReduceOp::kSum, t(4, {64, 256}, kBF16), {}, {});
  EXPECT_TRUE(rows.scaling.rowwise);
  EXPECT_EQ(rows.out_rows, 64);
  const auto cols = plan_scaled_matmul_reduce_scatter(2, a, b, scalar(2), scalar(3), -1, ReduceOp::kAvg,
                                                      t(4, {128, 128}, kBF16), {}, {});
  EXPECT_FALSE(cols.scaling.rowwise);
  EXPECT_EQ(cols.out_cols, 128);
  // Scatter along N: each rank's columns are a GEMM of their own, whose N must be a multiple of 16.
  EXPECT_REFUSED(plan_scaled_matmul_reduce_scatter(2, a, t(1, {48, 64}, kE4M3), scalar(2), scalar(3), -1,
                                                   ReduceOp::kSum, t(4, {128, 24}, kBF16), {}, {}),
                 "N is 24");
  EXPECT_REFUSED(plan_scaled_matmul_reduce_scatter(2, a, b, t(2, {64, 1}, kFP32), t(3, {1, 256}, kFP32), 0,
                                                   ReduceOp::kSum, t(4, {64, 256}, kBF16), {}, {}),
                 "a_scale has shape [64, 1]; expected [128, 1]");
}

// A bias is [N] in the output's dtype (bf16 for an fp8 output); a result scale is one fp32 element
// and only for an fp8 output, which takes tensor-wise scales.
TEST(ScaledPlan, BiasesAndResultScales) {
  const TensorRef a = t(0, {64, 128}, kE4M3), b = t(1, {256, 128}, kE4M3), out = t(2, {128, 256}, kBF16);
  const TensorRef fp8_out = t(2, {128, 256}, kE4M3), fp16_out = t(2, {128, 256}, DType::kFP16);
  const TensorRef bias = t(5, {256}, kBF16);
  EXPECT_FALSE(ag(a, b, scalar(3), scalar(4), out).scaling.bias);
  EXPECT_TRUE(ag(a, b, scalar(3), scalar(4), out, 0, {}, {bias, {}}).scaling.bias);
  EXPECT_TRUE(ag(a, b, t(3, {64, 1}, kFP32), t(4, {1, 256}, kFP32), out, 0, {}, {bias, {}}).scaling.bias);
  const auto fp8 = ag(a, b, scalar(3), scalar(4), fp8_out, 0, {}, {bias, scalar(6)});
  EXPECT_TRUE(fp8.scaling.fp8_out());
  EXPECT_EQ(fp8.scaling.partial_dtype(), kBF16);
  EXPECT_TRUE(ag(a, b, scalar(3), scalar(4), fp16_out, 0, {}, {t(5, {256}, DType::kFP16), {}}).scaling.bias);
  EXPECT_REFUSED(ag(a, b, scalar(3), scalar(4), fp16_out, 0, {}, {bias, {}}), "biases[0] is bf16; expected fp16");
  EXPECT_REFUSED(ag(a, b, scalar(3), scalar(4), fp8_out, 0, {}, {t(5, {256}, DType::kFP16), {}}),
                 "biases[0] is fp16; expected bf16 (the bias of an fp8 output is bf16)");
  EXPECT_REFUSED(ag(a, b, scalar(3), scalar(4), out, 0, {}, {t(5, {128}, kBF16), {}}),
                 "biases[0] has shape [128]; expected [256]");
  EXPECT_REFUSED(ag(a, b, scalar(3), scalar(4), out, 0, {}, {t(5, {1, 256}, kBF16), {}}), "biases[0] has shape [1, 256]");
  EXPECT_REFUSED(ag(a, b, scalar(3), scalar(4), out, 0, {}, {{}, scalar(6)}),
                 "result_scales[0] is given but the output is bf16; a result scale is for fp8 outputs only");
  EXPECT_REFUSED(ag(a, b, scalar(3), scalar(4), fp8_out, 0, {}, {{}, t(6, {2}, kFP32)}), "result_scales[0] has shape [2]");
  EXPECT_REFUSED(ag(a, b, t(3, {64, 1}, kFP32), t(4, {1, 256}, kFP32), fp8_out),
                 "the output is fp8 e4m3 with row-wise scales");
  EXPECT_REFUSED(scaled_epilogues("op", 2, {bias}, {}), "got 2 B(s) but 1 bias(es)");
  EXPECT_REFUSED(scaled_epilogues("op", 1, {}, {scalar(1), scalar(2)}), "got 1 B(s) but 2 result scale(s)");
  EXPECT_EQ(scaled_epilogues("op", 2, {}, {}).size(), 2u);

  const TensorRef ra = t(0, {128, 64}, kE4M3), rb = t(1, {256, 64}, kE4M3);
  const auto rs = plan_scaled_matmul_reduce_scatter(2, ra, rb, scalar(2), scalar(3), -1, ReduceOp::kSum,
                                                    t(4, {128, 128}, kE4M3), {bias, scalar(6)}, {});
  EXPECT_TRUE(rs.scaling.bias);
  EXPECT_TRUE(rs.scaling.fp8_out());
  EXPECT_REFUSED(plan_scaled_matmul_reduce_scatter(2, ra, rb, scalar(2), scalar(3), -1, ReduceOp::kSum,
                                                   t(4, {128, 128}, kBF16), {t(5, {128}, kBF16), {}}, {}),
                 "bias has shape [128]; expected [256]");
  EXPECT_REFUSED(plan_scaled_matmul_reduce_scatter(2, ra, rb, scalar(2), scalar(3), 0, ReduceOp::kSum,
                                                   t(4, {64, 256}, kBF16), {{}, scalar(6)}, {}),
                 "result_scale is given but the output is bf16");
}

}  // namespace
}  // namespace asynctp::ops
