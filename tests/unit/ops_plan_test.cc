// The ops' validation rules: each bad argument is refused with a message that names it and says what
// was expected. Pure functions of the arguments: no GPU needed (pointers here are never dereferenced).
#include <gtest/gtest.h>

#include <functional>

#include "asynctp/error.h"
#include "refusals.h"
#include "ops/plan.h"

namespace asynctp::ops {
namespace {

// Distinct, aligned, never dereferenced addresses.
void* fake(int i) { return reinterpret_cast<void*>(static_cast<uintptr_t>(0x10000000) * (i + 1)); }

TensorRef t(int i, std::initializer_list<int64_t> shape, DType d = DType::kBF16) { return TensorRef::dense(fake(i), d, shape); }

using testing::error_of;

TEST(AllGatherMatmulPlan, GatherDim0) {
  const auto p = plan_all_gather_matmul(2, t(0, {1024, 512}), {t(1, {512, 768}), t(2, {512, 256})}, 0,
                                        {t(3, {2048, 768}), t(4, {2048, 256})}, TensorRef{}, {});
  EXPECT_FALSE(p.gather_last);
  EXPECT_EQ(p.M, 2048);
  EXPECT_EQ(p.m_local, 1024);
  EXPECT_EQ(p.K, 512);
  EXPECT_EQ(p.N, (std::vector<int64_t>{768, 256}));
  EXPECT_FALSE(p.return_a);
}

// Shapes whose sizes do not fit in 64 bits are refused, with no overflow on the way (the sanitized
// build halts on one); auto sizes its problem only from a plan.
TEST(AllGatherMatmulPlan, SizesThatOverflowAreRefused) {
  const int64_t big = int64_t{1} << 40;
  auto ref = [](int i, int64_t rows, int64_t cols) {  // by hand: dense() refuses shapes whose count overflows
    TensorRef r;
    r.data = fake(i);
    r.ndim = 2;
    r.shape[0] = rows, r.shape[1] = cols;
    r.strides[0] = cols, r.strides[1] = 1;
    return r;
  };
  TensorRef batched = ref(0, big, 16);
  batched.ndim = 3;
  batched.shape[0] = batched.shape[1] = big, batched.shape[2] = 16;  // rows: 2^80
  batched.strides[0] = big * 16, batched.strides[1] = 16, batched.strides[2] = 1;
  EXPECT_THROW(plan_all_gather_matmul(2, batched, {ref(1, 16, 8)}, 0, {ref(2, 8, 8)}, TensorRef{}, {}), Error);
  EXPECT_THROW(plan_all_gather_matmul(1 << 30, ref(0, big, 8), {ref(1, 8, 8)}, 0, {ref(2, 8, 8)}, TensorRef{}, {}),
               Error);
  EXPECT_THROW(plan_all_gather_matmul(1 << 30, ref(0, 8, big), {ref(1, 8, 8)}, -1, {ref(2, 8, 8)}, TensorRef{}, {}),
               Error);
  EXPECT_THROW(plan_matmul_reduce_scatter(2, batched, ref(1, 16, 8), 0, ReduceOp::kSum, ref(2, 8, 8), {}), Error);
  EXPECT_THROW(plan_matmul_reduce_scatter(1 << 30, ref(0, 8, big), ref(1, big, 8), 0, ReduceOp::kSum, ref(2, 8, 8), {}),
               Error);
}

TEST(AllGatherMatmulPlan, GatherLastWithBatchDimsAndColumnMajorB) {
  OpOptions o;
  o.b_layout = BLayout::kColMajor;
  const auto p = plan_all_gather_matmul(4, t(0, {2, 8, 64}), {t(1, {96, 256})}, -1, {t(3, {2, 8, 96})},
                                        t(5, {2, 8, 256}), o);
  EXPECT_TRUE(p.gather_last);
  EXPECT_EQ(p.M, 16);
  EXPECT_EQ(p.k_local, 64);
  EXPECT_EQ(p.K, 256);
  EXPECT_EQ(p.N[0], 96);
  EXPECT_TRUE(p.return_a);
}

TEST(AllGatherMatmulPlan, RefusesEachBadArgumentByName) {
  const auto a = t(0, {1024, 512});
  const auto b = t(1, {512, 768});
  const auto out = t(3, {2048, 768});
  EXPECT_REFUSED(plan_all_gather_matmul(2, a, {t(1, {500, 768})}, 0, {out}, TensorRef{}, {}),
                 "bs[0] has shape [500, 768] ([K, N] for b_layout row-major) but A's K is 512; expected [512, N]");
  EXPECT_REFUSED(plan_all_gather_matmul(2, a, {b}, 0, {t(3, {1024, 768})}, TensorRef{}, {}),
                 "outputs[0] has shape [1024, 768]; expected [2048, 768]");
  EXPECT_REFUSED(plan_all_gather_matmul(2, a, {b}, 0, {}, TensorRef{}, {}), "got 1 B(s) but 0 output(s)");
  EXPECT_REFUSED(plan_all_gather_matmul(2, a, {}, 0, {}, TensorRef{}, {}), "bs is empty");
  EXPECT_REFUSED(plan_all_gather_matmul(2, t(0, {1024, 512}, DType::kFP32), {b}, 0, {out}, TensorRef{}, {}),
                 "dtype fp32 is not supported; expected bf16 or fp16");
  EXPECT_REFUSED(plan_all_gather_matmul(2, a, {t(1, {512, 768}, DType::kFP16)}, 0, {out}, TensorRef{}, {}),
                 "bs[0] is fp16 but expected bf16");
  EXPECT_REFUSED(plan_all_gather_matmul(2, t(0, {4, 8, 16}), {t(1, {16, 8})}, 1, {t(3, {8, 8, 8})}, TensorRef{}, {}),
                 "gather_dim is 1 for a 3-D input; expected 0 or the last dim (2 or -1)");
  EXPECT_REFUSED(plan_all_gather_matmul(2, a, {b}, 0, {out}, t(5, {1024, 512}), {}),
                 "gathered_a has shape [1024, 512]; expected [2048, 512]");
  OpOptions fused;
  fused.algorithm = Algorithm::kFused;
  EXPECT_NO_THROW(plan_all_gather_matmul(2, a, {b}, 0, {out}, TensorRef{}, fused));
  EXPECT_NO_THROW(plan_matmul_reduce_scatter(2, t(0, {1024, 256}), t(1, {256, 768}), 0, ReduceOp::kSum,
                                             t(3, {512, 768}), fused));
  OpOptions automatic;
  automatic.algorithm = Algorithm::kAuto;
  EXPECT_NO_THROW(plan_all_gather_matmul(2, a, {b}, 0, {out}, TensorRef{}, automatic));
  OpOptions bogus;
  bogus.algorithm = static_cast<Algorithm>(7);
  EXPECT_REFUSED(plan_all_gather_matmul(2, a, {b}, 0, {out}, TensorRef{}, bogus),
                 "all_gather_matmul: options.algorithm is 7; expected sequential, pipelined, fused or auto");
  OpOptions chunks;
  chunks.algorithm = Algorithm::kPipelined;
  chunks.chunks_per_rank = kMaxChunksPerRank + 1;
  EXPECT_REFUSED(plan_all_gather_matmul(2, a, {b}, 0, {out}, TensorRef{}, chunks),
                 "options.chunks_per_rank is 17; expected 0 (the default) to 16");
  chunks.chunks_per_rank = -1;
  EXPECT_REFUSED(plan_matmul_reduce_scatter(2, t(0, {1024, 256}), t(1, {256, 768}), 0, ReduceOp::kSum,
                                            t(3, {512, 768}), chunks),
                 "options.chunks_per_rank is -1");
  chunks.chunks_per_rank = kMaxChunksPerRank;
  EXPECT_NO_THROW(plan_all_gather_matmul(2, a, {b}, 0, {out}, TensorRef{}, chunks));
}

// An enum value outside its list (from C, Python or a cast) is refused by name, on both ops: read as
// row-major by the plan and as column-major by the fused kernel, it would compute neither.
TEST(Plans, UnknownBLayoutAndReduceOpAreRefusedByName) {
  const auto a = t(0, {1024, 512});
  const auto b = t(1, {512, 768});
  const auto out = t(3, {2048, 768});
  OpOptions layout;
  layout.b_layout = static_cast<BLayout>(2);
  EXPECT_REFUSED(plan_all_gather_matmul(2, a, {b}, 0, {out}, TensorRef{}, layout),
                 "all_gather_matmul: options.b_layout is 2; expected row-major (0) or col-major (1)");
  EXPECT_REFUSED(plan_matmul_reduce_scatter(2, t(0, {1024, 256}), t(1, {256, 768}), 0, ReduceOp::kSum,
                                            t(3, {512, 768}), layout),
                 "matmul_reduce_scatter: options.b_layout is 2; expected row-major (0) or col-major (1)");
  EXPECT_REFUSED(plan_matmul_reduce_scatter(2, t(0, {1024, 256}), t(1, {256, 768}), 0, static_cast<ReduceOp>(-1),
                                            t(3, {512, 768}), {}),
                 "matmul_reduce_scatter: reduce_op is -1; expected sum (0) or avg (1)");
  EXPECT_NO_THROW(plan_matmul_reduce_scatter(2, t(0, {1024, 256}), t(1, {256, 768}), 0, ReduceOp::kAvg,
                                             t(3, {512, 768}), {}));
}

TEST(AllGatherMatmulPlan, RefusesBadPointersStridesAndOverlaps) {
  const auto b = t(1, {512, 768});
  const auto out = t(3, {2048, 768});
  TensorRef misaligned = t(0, {1024, 512});
  misaligned.data = static_cast<char*>(misaligned.data) + 2;
  EXPECT_REFUSED(plan_all_gather_matmul(2, misaligned, {b}, 0, {out}, TensorRef{}, {}),
                 "a_shard data pointer 0x10000002 is not 16-byte aligned");
  TensorRef null_a = t(0, {1024, 512});
  null_a.data = nullptr;
  EXPECT_REFUSED(plan_all_gather_matmul(2, null_a, {b}, 0, {out}, TensorRef{}, {}), "a_shard has a null data pointer");
  TensorRef strided = t(0, {1024, 512});
  strided.strides[0] = 1024;
  EXPECT_REFUSED(plan_all_gather_matmul(2, strided, {b}, 0, {out}, TensorRef{}, {}),
                 "a_shard with shape [1024, 512] has strides [1024, 1]; expected a dense row-major tensor");
  EXPECT_REFUSED(plan_all_gather_matmul(2, t(0, {0, 512}), {b}, 0, {out}, TensorRef{}, {}),
                 "a_shard has shape [0, 512]; every dim must be > 0");
  TensorRef overlapping = out;
  overlapping.data = fake(0);  // the output on top of A
  EXPECT_REFUSED(plan_all_gather_matmul(2, t(0, {1024, 512}), {b}, 0, {overlapping}, TensorRef{}, {}),
                 "outputs[0] overlaps a_shard");
  EXPECT_REFUSED(plan_all_gather_matmul(2, t(0, {1024, 512}), {b}, 0, {out}, t(3, {2048, 512}), {}),
                 "gathered_a overlaps outputs[0]");
}

TEST(Plans, DimsPast32BitIndexingAreRefusedAndLargeTensorsAreNot) {
  // A GEMM dim of 2^31 no kernel can index; more than 2^31 elements in all is fine.
  const int64_t big = int64_t{1} << 31;
  EXPECT_REFUSED(plan_all_gather_matmul(2, t(0, {big / 2, 64}), {t(1, {64, 128})}, 0, {t(3, {big, 128})}, TensorRef{}, {}),
                 "all_gather_matmul: the GEMM's M is 2147483648 (a_shard's rows x world size); expected at most "
                 "2147483647 (2^31 - 1)");
  EXPECT_REFUSED(plan_all_gather_matmul(2, t(0, {64, big / 2}), {t(1, {64, 128})}, -1, {t(3, {64, 128})}, TensorRef{}, {}),
                 "the GEMM's K is 2147483648 (a_shard's last dim x world size)");
  EXPECT_REFUSED(plan_all_gather_matmul(2, t(0, {64, 64}), {t(1, {64, big})}, 0, {t(3, {128, big})}, TensorRef{}, {}),
                 "the GEMM's N is 2147483648 (bs[0]'s N)");
  EXPECT_REFUSED(plan_matmul_reduce_scatter(2, t(0, {big, 64}), t(1, {64, 64}), 0, ReduceOp::kSum, t(2, {big / 2, 64}), {}),
                 "matmul_reduce_scatter: the GEMM's M is 2147483648 (a's rows)");
  TensorRef huge = t(0, {1, 1});  // as a framework might hand it over: dense() refuses to make one
  huge.shape[0] = int64_t{1} << 40, huge.shape[1] = int64_t{1} << 30, huge.strides[0] = int64_t{1} << 30;
  EXPECT_REFUSED(plan_all_gather_matmul(2, huge, {t(1, {64, 128})}, 0, {t(3, {64, 128})}, TensorRef{}, {}),
                 "a_shard has shape [1099511627776, 1073741824], more than 2^59 elements");
  EXPECT_REFUSED(TensorRef::dense(fake(0), DType::kBF16, {int64_t{1} << 40, int64_t{1} << 30}),
                 "TensorRef::dense: a shape of 2 dims whose element count does not fit in int64");
  auto far = [](int i, std::initializer_list<int64_t> shape) {
    return TensorRef::dense(reinterpret_cast<void*>(static_cast<uintptr_t>(i + 1) << 40), DType::kBF16, shape);
  };
  const auto p = plan_all_gather_matmul(2, far(0, {32768, 40000}), {far(1, {40000, 65536})}, 0,
                                        {far(2, {65536, 65536})}, TensorRef{}, {});
  EXPECT_EQ(p.M * p.N[0], int64_t{1} << 32);
}

TEST(MatmulReduceScatterPlan, BothScatterDims) {
  auto p = plan_matmul_reduce_scatter(2, t(0, {4096, 4096}), t(1, {4096, 3584}), 0, ReduceOp::kSum,
                                      t(2, {2048, 3584}), {});
  EXPECT_FALSE(p.scatter_last);
  EXPECT_EQ(p.out_rows, 2048);
  EXPECT_EQ(p.out_cols, 3584);
  OpOptions col;
  col.b_layout = BLayout::kColMajor;
  p = plan_matmul_reduce_scatter(2, t(0, {2, 64, 128}), t(1, {96, 128}), -1, ReduceOp::kAvg, t(2, {2, 64, 48}), col);
  EXPECT_TRUE(p.scatter_last);
  EXPECT_EQ(p.M, 128);
  EXPECT_EQ(p.N, 96);
  EXPECT_EQ(p.out_cols, 48);
}

TEST(MatmulReduceScatterPlan, RefusesEachBadArgumentByName) {
  EXPECT_REFUSED(plan_matmul_reduce_scatter(2, t(0, {1001, 64}), t(1, {64, 32}), 0, ReduceOp::kSum, t(2, {500, 32}), {}),
                 "a's dim 0 is 1001 (shape [1001, 64]), not divisible by the world size 2");
  EXPECT_REFUSED(plan_matmul_reduce_scatter(2, t(0, {64, 64}), t(1, {64, 33}), -1, ReduceOp::kSum, t(2, {64, 16}), {}),
                 "N = 33 is not divisible by the world size 2");
  EXPECT_REFUSED(plan_matmul_reduce_scatter(2, t(0, {64, 64}), t(1, {32, 32}), 0, ReduceOp::kSum, t(2, {32, 32}), {}),
                 "b has shape [32, 32] ([K/world, N]) but a has K/world = 64; expected [64, N]");
  EXPECT_REFUSED(plan_matmul_reduce_scatter(2, t(0, {64, 64}), t(1, {64, 32}), 0, ReduceOp::kSum, t(2, {64, 32}), {}),
                 "output has shape [64, 32]; expected [32, 32]");
}

TEST(Signature, DiffersWhereCallsDiffer) {
  const auto a = t(0, {1024, 512});
  const auto s1 = signature_of("all_gather_matmul", a, {t(1, {512, 768})}, 0, {}, 0);
  const auto s2 = signature_of("all_gather_matmul", t(0, {1024, 256}), {t(1, {512, 768})}, 0, {}, 0);
  EXPECT_EQ(s1.fields.size(), s2.fields.size());
  EXPECT_NE(s1.fields, s2.fields);
  EXPECT_EQ(s1.fields, signature_of("all_gather_matmul", a, {t(1, {512, 768})}, 0, {}, 0).fields);
}

}  // namespace
}  // namespace asynctp::ops
