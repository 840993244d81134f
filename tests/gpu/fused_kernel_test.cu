// The fused GEMM kernel itself, called directly (never the cuBLASLt fallback), as a plain GEMM: whole
// tiles and a last round split along K (tail_split.h), odd shapes, both dtypes and B layouts. A split
// tile's last split adds the others' partial sums in a fixed order, so a second launch gives the same
// bits; a launch with new inputs right after checks that each launch leaves the split counters ready
// for the next (a stale counter would let a last split add the previous launch's partial sums).
// And as the all-gather's GEMM: every compiled instantiation waits for its rows' flag before it reads
// them (a build that ran stale code for two instantiations once passed for a kernel bug: docs/design/fused_all_gather_matmul.md).
#include <chrono>
#include <thread>
#include <cstring>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cutlass/fast_math.h>

#include "algo/fused.h"
#include "comm/communicator_impl.h"
#include "common/element.h"
#include "kernels/fused/fused_gemm.h"
#include "kernels/fused/async_input_scheduler.cuh"
#include "kernels/fused/reduce_scatter_tiles.h"
#include "kernels/fused/tail_split.h"
#include "ops_test_cases.h"

namespace asynctp {
namespace {

using namespace testing;

struct KernelCase {
  int64_t M, N, K;
  DType dtype;
  bool col_major;
  bool expect_split;  // on a GPU of 132 SMs (H100 SXM, H200); checked against the plan where that holds
  bool row_scales = false;  // fp8: row-wise scales (one per row of A, one per column of B) for the alpha
  int tile_n = 0;           // 0: the kernel's choice
  // fp8: the kernel as a one-rank reduce-scatter (every tile its own, nothing to add), which scales each
  // value (by its row's and column's scale, or the tensor-wise alpha) and adds the bias before the sum
  // (reduce_scatter_fixup.cuh), not in the epilogue. tile_n set.
  bool one_rank_rs = false;
  bool bias = false;  // fp8: a bias over N, of the product's type, added after the scales
  bool fp16_out = false;  // fp8: an fp16 product (and bias) in place of bf16
};

// fp8 row-wise scales, exact in fp32: 0.5 to 1.25, a different cycle for A's rows and B's columns.
__global__ void fill_row_scales(float* s, int64_t n, int period) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    s[i] = 0.5f + static_cast<float>(i % period) * 0.125f;
  }
}

__device__ void store(__nv_bfloat16* p, float v) { *p = __float2bfloat16(v); }
__device__ void store(__half* p, float v) { *p = __float2half(v); }

// An fp8 case's bias (bf16 or fp16), exact in either (-3 to 3 in halves), and the reference's share of
// it: the check multiplies the reference by `scale`, so it gains bias / scale.
template <class T>
__global__ void fill_bias_and_add(T* bias, float* ref, int64_t rows, int64_t cols, float scale) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < rows * cols;
       i += gridDim.x * static_cast<int64_t>(blockDim.x)) {
    const int64_t col = i % cols;
    const float value = static_cast<float>(col % 13 - 6) * 0.5f;
    if (i < cols) store(bias + col, value);
    ref[i] += value / scale;
  }
}

std::vector<char> host_copy(const Buf& b, size_t bytes) {
  std::vector<char> h(bytes);
  RANK_CUDA(cudaMemcpy(h.data(), b.p, bytes, cudaMemcpyDeviceToHost));
  return h;
}

// fp8 cases' tensor-wise alpha (a_scale * b_scale), read by the kernel from the device: exact in fp32.
constexpr float kFp8Alpha = 0.75f * 1.25f;

// Fills A and B from `seed`, runs the kernel with at most `max_splits` splits, checks C against the
// fp32 GEMM of the same inputs, and returns C's bytes. An fp8 case (e4m3 A and B, B column-major) has
// a bf16 (fp16_out: fp16) product scaled by kFp8Alpha, or with row_scales by A's row's and B's column's scale, checked
// against the fp32 GEMM of the fp8 values read back (scaled first).
std::vector<char> run_checked(Communicator& comm, const KernelCase& c, uint64_t seed, int max_splits,
                              reference::Fp32Gemm& fp32, cudaStream_t s) {
  const bool fp8 = c.dtype == DType::kFP8E4M3;
  const DType out_dtype = !fp8 ? c.dtype : c.fp16_out ? DType::kFP16 : DType::kBF16;
  const size_t es = dtype_size(c.dtype), out_es = dtype_size(out_dtype);
  Buf a(c.M * c.K * es), b(c.K * c.N * es), out(c.M * c.N * out_es), alpha(sizeof(float)), bias(c.N * 2);
  Buf row_scales(c.M * sizeof(float)), col_scales(c.N * sizeof(float));
  Buf a32(c.M * c.K * 4), b32(c.K * c.N * 4), ref(c.M * c.N * 4);
  const GenMatrix ga{seed, 0, 0}, gb{seed + 1, 0, 0};
  reference::fill(a.p, c.dtype, c.M, c.K, false, ga, 0, 0, s);
  reference::fill(b.p, c.dtype, c.K, c.N, c.col_major, gb, 0, 0, s);
  if (fp8) {
    reference::fill_fp32_as(a32.f(), c.dtype, c.M, c.K, ga, 0, 0, s);
    reference::fill_fp32_as(b32.f(), c.dtype, c.K, c.N, gb, 0, 0, s);
    RANK_CUDA(cudaMemcpyAsync(alpha.p, &kFp8Alpha, sizeof kFp8Alpha, cudaMemcpyHostToDevice, s));
    if (c.row_scales) {
      fill_row_scales<<<32, 256, 0, s>>>(row_scales.f(), c.M, 7);
      fill_row_scales<<<32, 256, 0, s>>>(col_scales.f(), c.N, 5);
      RANK_CUDA(cudaGetLastError());
      reference::scale(a32.f(), c.M, c.K, row_scales.f(), c.M, nullptr, 1, s);
      reference::scale(b32.f(), c.K, c.N, nullptr, 1, col_scales.f(), c.N, s);
    }
  } else {
    reference::fill_fp32(a32.f(), c.M, c.K, ga, 0, 0, s);
    reference::fill_fp32(b32.f(), c.K, c.N, gb, 0, 0, s);
  }
  fp32.run(a32.f(), b32.f(), ref.f(), c.M, c.N, c.K, s);
  const float scale = fp8 && !c.row_scales ? kFp8Alpha : 1.0f;
  if (c.bias) {
    if (c.fp16_out) {
      fill_bias_and_add<<<64, 256, 0, s>>>(static_cast<__half*>(bias.p), ref.f(), c.M, c.N, scale);
    } else {
      fill_bias_and_add<<<64, 256, 0, s>>>(static_cast<__nv_bfloat16*>(bias.p), ref.f(), c.M, c.N, scale);
    }
    RANK_CUDA(cudaGetLastError());
  }
  reference::poison(out.p, c.M * c.N * out_es, s);

  kernels::fused::FusedGemmArgs g;
  g.dtype = element_of(c.dtype);
  if (fp8) g.out = element_of(out_dtype);
  g.b_layout = c.col_major ? Layout::kColMajor : Layout::kRowMajor;
  g.M = c.M, g.N = c.N, g.K = c.K;
  g.a = a.p, g.b = b.p, g.c = out.p;
  g.tile_n = c.tile_n;
  if (fp8 && c.one_rank_rs) {
    g.rs = kernels::fused::ReduceScatterTiles::one_rank(static_cast<int32_t>(c.M),
                                                        static_cast<int32_t>((c.N + c.tile_n - 1) / c.tile_n));
    if (c.row_scales) {
      g.rs.row_scales = row_scales.f(), g.rs.col_scales = col_scales.f();
    } else {
      g.rs.partial_scale = alpha.f();
    }
    g.rs.cols = static_cast<int32_t>(c.N);
    if (c.bias) g.rs.bias = bias.p;
  } else if (fp8 && c.row_scales) {
    g.row_scales = row_scales.f(), g.col_scales = col_scales.f();
  } else if (fp8) {
    g.alpha_ptr = alpha.f();
  }
  if (c.bias && !c.one_rank_rs) g.bias = bias.p;
  algo::attach_grid(comm, g, s);
  RANK_CHECK(g.split_workspace != nullptr, "no split workspace outside graph capture");
  g.max_splits = max_splits;
  RANK_CHECK(*kernels::fused::fused_gemm_unsupported(g) == '\0', "the kernel refused ", c.M, "x", c.N, "x", c.K);
  kernels::fused::run_fused_gemm(g, s);
  // fp8 accumulates fast: the tolerance of an fp8 GEMM so (the 16-bit outputs' own rounding is finer
  // than that accumulation's error, fp16's most of all).
  const double tol = fp8 ? reference::fast_accum_tolerance(out_dtype, 1, c.K) : reference::tolerance(out_dtype, 1);
  const auto cmp = reference::compare(out.p, out_dtype, c.M, c.N, ref.f(), c.N, 0, 0, scale, tol, s);
  RANK_CHECK(cmp.ok(), c.M, "x", c.N, "x", c.K, " ", dtype_name(c.dtype), c.col_major ? " B=col" : " B=row",
             c.row_scales ? " row-wise" : "", c.one_rank_rs ? " one-rank reduce-scatter" : "",
             c.bias ? " bias" : "", c.fp16_out ? " fp16 out" : "", " max_splits=", max_splits, ": ", cmp.bad, " bad elements, max err ", cmp.max_abs_err, cmp.where());
  RANK_CUDA(cudaStreamSynchronize(s));
  return host_copy(out, c.M * c.N * out_es);
}

// Whether the cooperative kernel's plan splits this case on this GPU, in the tile width pick_tile_n
// gives it.
bool plan_splits(const KernelCase& c, int sms) {
  using namespace kernels::fused;
  const int tile_n = pick_tile_n(c.M, c.N, c.K, sms, kMaxTailSplits);
  const bool one_row = tile_n == kOneRowTileN;  // one-CTA clusters of one tile row
  const int64_t rows = one_row ? kTileRows : kClusterRows;
  const int64_t cluster_tiles = ((c.M + rows - 1) / rows) * ((c.N + tile_n - 1) / tile_n);
  return plan_tail_split(cluster_tiles, one_row ? sms : sms / 2, (c.K + kTileK - 1) / kTileK).splits > 1;
}

TEST(FusedKernel, SplitLastRoundMatchesReferenceAndRepeatsBitForBit) {
  REQUIRE_GPUS(1);
  RUN_RANKS(1, [](RankContext& ctx) {
    auto comm = make_comm(ctx);
    cudaStream_t s = nullptr;
    RANK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    reference::Fp32Gemm fp32;
    int sms = 0;
    RANK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, impl_of(*comm).device));
    const std::vector<KernelCase> cases = {
        {256, 256, 4096, DType::kBF16, false, true},     // one tile, split 4 ways
        {1000, 520, 1000, DType::kFP16, true, true},     // ragged in M, N and K
        {4096, 6656, 4096, DType::kBF16, true, true},    // 6 full rounds and 20 tail tiles, split 2 ways
        {4096, 6656, 1024, DType::kBF16, true, false},   // the same tail in 16 steps along K: whole
        {520, 264, 520, DType::kBF16, false, true},      // K of 9 steps: splits of 4 and 5
        {512, 8448, 512, DType::kFP16, false, false},    // 66 tiles: one full round, nothing to split
        {16384, 4096, 128, DType::kBF16, true, false},   // too shallow in K to split
        {128, 4096, 4096, DType::kBF16, true, true},     // one tile row: 32 tiles of 128 x 128, split 4 ways
        {100, 520, 1000, DType::kFP16, false, true},     // one ragged tile row: 5 tiles, split 4 ways
    };
    int split_cases = 0;
    for (KernelCase c : cases) {
      // The cooperative kernel's tiles, which split: at these sizes the ping-pong schedule (which does
      // not) would be the default above one tile row.
      c.tile_n = kernels::fused::pick_tile_n(c.M, c.N, c.K, sms, kernels::fused::kMaxTailSplits);
      if (sms == 132) {
        RANK_CHECK(plan_splits(c, sms) == c.expect_split, c.M, "x", c.N, "x", c.K, ": the plan ",
                   c.expect_split ? "does not split" : "splits");
      }
      split_cases += plan_splits(c, sms) ? 1 : 0;
      const auto first = run_checked(*comm, c, 11, kernels::fused::kMaxTailSplits, fp32, s);
      const auto second = run_checked(*comm, c, 11, kernels::fused::kMaxTailSplits, fp32, s);
      RANK_CHECK(first == second, c.M, "x", c.N, "x", c.K, ": two launches gave different bits");
      (void)run_checked(*comm, c, 23, kernels::fused::kMaxTailSplits, fp32, s);  // new inputs
      (void)run_checked(*comm, c, 23, 1, fp32, s);                                // every tile whole
    }
    RANK_CHECK(split_cases >= 3, "only ", split_cases, " cases split on ", sms, " SMs");
    // The ping-pong schedule's 128-wide tiles, never split: ragged, one cluster tile, and many rounds
    // (each consumer warpgroup takes every other unit of its CTA).
    const std::vector<KernelCase> pingpong = {
        {1000, 520, 1000, DType::kFP16, true, false, false, kernels::fused::kPingpongTileN},
        {256, 128, 4096, DType::kBF16, false, false, false, kernels::fused::kPingpongTileN},
        {4096, 6656, 1024, DType::kBF16, true, false, false, kernels::fused::kPingpongTileN},
        {520, 264, 520, DType::kFP16, false, false, false, kernels::fused::kPingpongTileN},
    };
    for (const KernelCase& c : pingpong) {
      const auto first = run_checked(*comm, c, 11, kernels::fused::kMaxTailSplits, fp32, s);
      const auto second = run_checked(*comm, c, 11, kernels::fused::kMaxTailSplits, fp32, s);
      RANK_CHECK(first == second, "ping-pong ", c.M, "x", c.N, "x", c.K, ": two launches gave different bits");
    }
    // An odd number of tile rows within a round: 128 x 128 tiles in one-CTA clusters, the kernel's
    // choice (one_cta_takes), split over the idle SMs like a problem of one tile row.
    const std::vector<KernelCase> one_cta = {
        {384, 4096, 1024, DType::kBF16, false, false},
        {300, 520, 1000, DType::kFP16, true, false},
    };
    for (const KernelCase& c : one_cta) {
      RANK_CHECK(kernels::fused::one_cta_takes(c.M, c.N, sms, element_of(c.dtype)), c.M, "x", c.N,
                 ": not one-CTA clusters on ", sms, " SMs");
      const auto first = run_checked(*comm, c, 11, kernels::fused::kMaxTailSplits, fp32, s);
      const auto second = run_checked(*comm, c, 11, kernels::fused::kMaxTailSplits, fp32, s);
      RANK_CHECK(first == second, "one-CTA ", c.M, "x", c.N, "x", c.K, ": two launches gave different bits");
      (void)run_checked(*comm, c, 23, 1, fp32, s);  // every tile whole
    }
    // Cooperative 192-wide tiles of less than a round split three or four ways along K, the kernel's
    // choice (split_192_takes) ahead of the ping-pong schedule: ragged N, and two cluster rows.
    const std::vector<KernelCase> split_192 = {
        {256, 2000, 4096, DType::kBF16, false, false},
        {512, 2048, 4096, DType::kFP16, true, false},
    };
    for (const KernelCase& c : split_192) {
      RANK_CHECK(kernels::fused::split_192_takes(c.M, c.N, c.K, sms, kernels::fused::kMaxTailSplits), c.M, "x", c.N,
                 "x", c.K, ": not 192-wide split tiles on ", sms, " SMs");
      const auto first = run_checked(*comm, c, 11, kernels::fused::kMaxTailSplits, fp32, s);
      const auto second = run_checked(*comm, c, 11, kernels::fused::kMaxTailSplits, fp32, s);
      RANK_CHECK(first == second, "192-wide ", c.M, "x", c.N, "x", c.K, ": two launches gave different bits");
      (void)run_checked(*comm, c, 23, 1, fp32, s);  // every tile whole (ping-pong's then)
    }
    // The widest tiles (kWideTileN, 16 bits): the kernel's choice at 1024 x 5120 x 5120 (one round where
    // 256-wide tiles take 1.2), a last tile 40 of 320 wide, a tail split along K, several rounds, and an odd
    // number of tile rows; each whole as well.
    RANK_CHECK(sms != 132 || kernels::fused::pick_tile_n(1024, 5120, 5120, sms, kernels::fused::kMaxTailSplits) ==
                                 kernels::fused::kWideTileN,
               "1024x5120x5120 does not take the widest tiles on 132 SMs");
    const std::vector<KernelCase> wide = {
        {1024, 5120, 5120, DType::kBF16, false, false}, {1000, 1000, 1000, DType::kFP16, true, false},
        {512, 5120, 4096, DType::kBF16, true, false},   {4096, 6656, 512, DType::kFP16, false, false},
        {384, 648, 520, DType::kBF16, false, false},
    };
    for (KernelCase c : wide) {
      c.tile_n = kernels::fused::kWideTileN;
      const auto first = run_checked(*comm, c, 11, kernels::fused::kMaxTailSplits, fp32, s);
      const auto second = run_checked(*comm, c, 11, kernels::fused::kMaxTailSplits, fp32, s);
      RANK_CHECK(first == second, "320-wide ", c.M, "x", c.N, "x", c.K, ": two launches gave different bits");
      (void)run_checked(*comm, c, 23, 1, fp32, s);  // every tile whole
    }
    cudaStreamDestroy(s);
    return 0;
  });
}


// The fp8 instantiations (e4m3 A and B, B column-major, a bf16 or fp16 product, alpha read from the device as
// a tensor-wise a_scale * b_scale, or row-wise scales applied by the epilogue, or by a one-rank
// reduce-scatter's kernel before its sum; a bias added by the epilogue after either), as a plain GEMM: whole
// tiles, split tiles and ragged shapes, against the fp32 GEMM of the fp8 values read back
// (run_checked); a second launch gives the same bits; what they do not take is refused by name.
TEST(FusedKernel, Fp8MatchesTheDequantisedReference) {
  REQUIRE_GPUS(1);
  RUN_RANKS(1, [](RankContext& ctx) {
    auto comm = make_comm(ctx);
    cudaStream_t s = nullptr;
    RANK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    reference::Fp32Gemm fp32;
    const std::vector<KernelCase> cases = {
        {256, 256, 4096, DType::kFP8E4M3, true, true},     // one cluster tile (the ping-pong's)
        {1000, 528, 1024, DType::kFP8E4M3, true, true},    // ragged in M and N (the ping-pong's)
        {4096, 3584, 1024, DType::kFP8E4M3, true, true},   // three whole rounds, then a split tail
        {520, 272, 528, DType::kFP8E4M3, true, true},      // ragged in K too (the ping-pong's)
        {128, 4096, 4096, DType::kFP8E4M3, true, true},    // one tile row: one-CTA clusters, split 4 ways
        {72, 528, 1024, DType::kFP8E4M3, true, true},      // one ragged tile row
        // Each shape of more than one tile row in the schedule the kernel would not pick: the
        // cooperative one's splits along K (one cluster tile split 4 ways), and the ping-pong's rounds.
        {256, 256, 4096, DType::kFP8E4M3, true, true, false, 256},
        {1000, 528, 1024, DType::kFP8E4M3, true, true, false, 256},
        {4096, 3584, 1024, DType::kFP8E4M3, true, true, false, kernels::fused::kPingpongTileN},
        {520, 272, 528, DType::kFP8E4M3, true, true, false, 256},
        // Row-wise scales, applied by the epilogue: the same cases.
        {256, 256, 4096, DType::kFP8E4M3, true, true, true},
        {1000, 528, 1024, DType::kFP8E4M3, true, true, true},
        {4096, 3584, 1024, DType::kFP8E4M3, true, true, true},
        {520, 272, 528, DType::kFP8E4M3, true, true, true},
        {128, 4096, 4096, DType::kFP8E4M3, true, true, true},
        {72, 528, 1024, DType::kFP8E4M3, true, true, true},
        {256, 256, 4096, DType::kFP8E4M3, true, true, true, 256},
        {1000, 528, 1024, DType::kFP8E4M3, true, true, true, 256},
        {4096, 3584, 1024, DType::kFP8E4M3, true, true, true, kernels::fused::kPingpongTileN},
        {520, 272, 528, DType::kFP8E4M3, true, true, true, 256},
        // The ping-pong schedule's 192-wide tiles: where the kernel takes them (two whole rounds on 132
        // SMs: pingpong_192_takes, where the 128-wide tiles fill their rounds no better than the 256-wide
        // ones), and forced on ragged M, N and K, with a bias, with an fp16 product.
        {1024, 6336, 8192, DType::kFP8E4M3, true, false, true},
        {1000, 528, 1024, DType::kFP8E4M3, true, true, true, kernels::fused::kPingpongWideTileN},
        {520, 272, 528, DType::kFP8E4M3, true, true, true, kernels::fused::kPingpongWideTileN},
        {1000, 528, 1024, DType::kFP8E4M3, true, true, true, kernels::fused::kPingpongWideTileN, false, true},
        {1000, 528, 1024, DType::kFP8E4M3, true, true, true, kernels::fused::kPingpongWideTileN, false, true, true},
        // Row-wise scales staged in shared memory a tile ahead of the consumers, in two slots
        // (row_scale_epilogue.cuh): about ten tiles a CTA, each a single K step, which the epilogue warp
        // outruns most.
        {12288, 3584, 128, DType::kFP8E4M3, true, false, true, 256},
        // Row-wise scales applied before the reduce-scatter's sum, in each kind of tile: the cooperative
        // kernel's 256-wide (split, whole, ragged N), the ping-pong's, one-CTA clusters'.
        {256, 256, 4096, DType::kFP8E4M3, true, true, true, 256, true},
        {1024, 528, 1024, DType::kFP8E4M3, true, true, true, 256, true},
        {4096, 3584, 1024, DType::kFP8E4M3, true, true, true, 256, true},
        {512, 272, 512, DType::kFP8E4M3, true, true, true, kernels::fused::kPingpongTileN, true},
        {384, 272, 512, DType::kFP8E4M3, true, true, true, kernels::fused::kOneRowTileN, true},
        // ...about ten tiles a CTA, each a single K step.
        {12288, 3584, 128, DType::kFP8E4M3, true, false, true, 256, true},
        // A bias added by the epilogue after the scales, tensor-wise and row-wise, in each kind of tile:
        // the ping-pong's, the cooperative kernel's (a split tail; ragged N forced), one-CTA clusters'.
        {1000, 528, 1024, DType::kFP8E4M3, true, true, false, 0, false, true},
        {4096, 3584, 1024, DType::kFP8E4M3, true, true, false, 0, false, true},
        {520, 272, 528, DType::kFP8E4M3, true, true, false, 256, false, true},
        {72, 528, 1024, DType::kFP8E4M3, true, true, false, 0, false, true},
        {1000, 528, 1024, DType::kFP8E4M3, true, true, true, 0, false, true},
        {4096, 3584, 1024, DType::kFP8E4M3, true, true, true, 0, false, true},
        {520, 272, 528, DType::kFP8E4M3, true, true, true, 256, false, true},
        {128, 4096, 4096, DType::kFP8E4M3, true, true, true, 0, false, true},
        // The bias added before the reduce-scatter's sum, after its scales, tensor-wise and row-wise.
        {1024, 528, 1024, DType::kFP8E4M3, true, true, false, 256, true, true},
        {512, 272, 512, DType::kFP8E4M3, true, true, false, kernels::fused::kPingpongTileN, true, true},
        {4096, 3584, 1024, DType::kFP8E4M3, true, true, true, 256, true, true},
        {384, 272, 512, DType::kFP8E4M3, true, true, true, kernels::fused::kOneRowTileN, true, true},
        // An fp16 product, with an fp16 bias, in each instantiation: tensor-wise and row-wise, the
        // cooperative kernel's (a split tail), the ping-pong's, one-CTA clusters', and the one-rank
        // reduce-scatter's.
        {4096, 3584, 1024, DType::kFP8E4M3, true, true, false, 0, false, true, true},
        {1000, 528, 1024, DType::kFP8E4M3, true, true, false, 0, false, true, true},
        {72, 528, 1024, DType::kFP8E4M3, true, true, false, 0, false, true, true},
        {4096, 3584, 1024, DType::kFP8E4M3, true, true, true, 0, false, true, true},
        {1000, 528, 1024, DType::kFP8E4M3, true, true, true, 0, false, false, true},
        {128, 4096, 4096, DType::kFP8E4M3, true, true, true, 0, false, true, true},
        {1024, 528, 1024, DType::kFP8E4M3, true, true, false, 256, true, true, true},
        {512, 272, 512, DType::kFP8E4M3, true, true, true, kernels::fused::kPingpongTileN, true, true, true},
        {384, 272, 512, DType::kFP8E4M3, true, true, false, kernels::fused::kOneRowTileN, true, false, true},
    };
    for (const KernelCase& c : cases) {
      for (int max_splits : {kernels::fused::kMaxTailSplits, 1}) {
        const auto first = run_checked(*comm, c, 31, max_splits, fp32, s);
        const auto second = run_checked(*comm, c, 31, max_splits, fp32, s);
        RANK_CHECK(first == second, "fp8 ", c.M, "x", c.N, "x", c.K, ": two launches gave different bits");
      }
    }
    // What the fp8 instantiation does not take is refused by name.
    kernels::fused::FusedGemmArgs row_b;
    row_b.dtype = Element::kFP8E4M3;
    row_b.b_layout = Layout::kRowMajor;
    row_b.M = row_b.N = row_b.K = 256;
    RANK_CHECK(contains(kernels::fused::fused_gemm_unsupported(row_b), "column-major"), "a row-major fp8 B was taken");
    kernels::fused::FusedGemmArgs fp8_out = row_b;
    fp8_out.b_layout = Layout::kColMajor;
    fp8_out.out = Element::kFP8E4M3;
    RANK_CHECK(contains(kernels::fused::fused_gemm_unsupported(fp8_out), "bf16 or fp16"), "an fp8 product was taken");
    kernels::fused::FusedGemmArgs half_scaled;
    half_scaled.dtype = Element::kFP8E4M3;
    half_scaled.b_layout = Layout::kColMajor;
    half_scaled.M = half_scaled.N = half_scaled.K = 256;
    half_scaled.row_scales = &kFp8Alpha;
    RANK_CHECK(contains(kernels::fused::fused_gemm_unsupported(half_scaled), "row and column scales together"),
               "row scales without column scales were taken");
    kernels::fused::FusedGemmArgs bf16_scaled = half_scaled;
    bf16_scaled.dtype = Element::kBF16;
    bf16_scaled.col_scales = &kFp8Alpha;
    RANK_CHECK(contains(kernels::fused::fused_gemm_unsupported(bf16_scaled), "fp8 only"), "bf16 row scales were taken");
    // A bias: fp8 only, on a 16-byte boundary, a reduce-scatter's in ReduceScatterTiles.
    Buf bias(64);
    kernels::fused::FusedGemmArgs biased;
    biased.dtype = Element::kFP8E4M3;
    biased.b_layout = Layout::kColMajor;
    biased.M = biased.N = biased.K = 256;
    biased.bias = static_cast<char*>(bias.p) + 2;
    RANK_CHECK(contains(kernels::fused::fused_gemm_unsupported(biased), "16-byte boundary"), "a misaligned bias was taken");
    biased.bias = bias.p;
    biased.rs.rank = 0, biased.rs.world = 1;
    RANK_CHECK(contains(kernels::fused::fused_gemm_unsupported(biased), "in ReduceScatterTiles"),
               "a reduce-scatter's bias was taken in place of its own");
    biased.bias = nullptr;
    biased.rs.bias = bias.p;  // rs.cols unset
    RANK_CHECK(contains(kernels::fused::fused_gemm_unsupported(biased), "cols = N"),
               "a reduce-scatter's bias without its columns was taken");
    kernels::fused::FusedGemmArgs bf16_biased;
    bf16_biased.M = bf16_biased.N = bf16_biased.K = 256;
    bf16_biased.bias = bias.p;
    RANK_CHECK(contains(kernels::fused::fused_gemm_unsupported(bf16_biased), "fp8 only"), "a bf16 bias was taken");
    cudaStreamDestroy(s);
    return 0;
  });
}

// The two "ranks" of the tests below: rows [0, m) of A are this rank's own (read from a_local), rows
// [m, 2m) the peer's one chunk, in place once its flag (flags[kMaxChunksPerRank]) reaches the epoch, 1.
// It also holds the test's two streams: `s` for the kernel, `copier` for the peer's rows and flag.
struct TwoRankFlags {
  Buf flags{2 * kMaxChunksPerRank * sizeof(uint32_t)}, epoch{sizeof(uint32_t)};
  cudaStream_t s = nullptr, copier = nullptr;

  TwoRankFlags() {
    RANK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    RANK_CUDA(cudaStreamCreateWithFlags(&copier, cudaStreamNonBlocking));
    kernels::fused::load_fused_gemm_kernels();
  }
  ~TwoRankFlags() {
    cudaStreamDestroy(copier);
    cudaStreamDestroy(s);
  }
  TwoRankFlags(const TwoRankFlags&) = delete;
  TwoRankFlags& operator=(const TwoRankFlags&) = delete;

  void reset() {
    static const uint32_t one = 1;
    RANK_CUDA(cudaMemsetAsync(flags.p, 0, 2 * kMaxChunksPerRank * sizeof(uint32_t), s));
    RANK_CUDA(cudaMemcpyAsync(epoch.p, &one, sizeof(one), cudaMemcpyHostToDevice, s));
  }
  // This rank's own chunk in the gathered buffer, as the op has it there for a tile that holds both.
  void raise_own() { RANK_CUDA(cudaMemcpyAsync(flags.p, epoch.p, sizeof(uint32_t), cudaMemcpyDeviceToDevice, s)); }
  // The peer's chunk, on `copier` after the copy of its rows.
  void raise_peer() {
    RANK_CUDA(cudaMemcpyAsync(static_cast<uint32_t*>(flags.p) + kMaxChunksPerRank, epoch.p, sizeof(uint32_t),
                              cudaMemcpyDeviceToDevice, copier));
  }
  // Launches `g` (A, B, C and the tile set) on these flags, on `sms` SMs (0: the communicator's budget),
  // and checks that it is still running, waiting for the peer's rows, 50 ms on.
  void launch_waiting(Communicator& comm, kernels::fused::FusedGemmArgs& g, const void* a_local, int64_t m,
                      const std::string& what, int sms = 0) {
    g.a_local = a_local, g.local_begin = 0, g.local_end = m;
    g.chunks.flags = static_cast<const uint32_t*>(flags.p);
    g.chunks.epoch = static_cast<const uint32_t*>(epoch.p);
    g.chunks.flag_stride = kMaxChunksPerRank;
    g.chunks.rows_per_rank = static_cast<int32_t>(m);
    g.chunks.rows_per_chunk = static_cast<int32_t>(m);
    g.chunks.wait = kernels::WaitContext{impl_of(comm).fault, 20'000'000'000ull, 0};
    algo::attach_grid(comm, g, s);
    if (sms > 0) g.sms = sms;
    kernels::fused::run_fused_gemm(g, s);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    RANK_CHECK(cudaStreamQuery(s) == cudaErrorNotReady, what, ": the kernel finished before its rows' flag was raised");
  }
};

// Every 16-bit instantiation (dtype, B layout, tile width, and the ping-pong schedule's), as the
// all-gather's GEMM of two "ranks" on one GPU: rows [0, M/2) are local; rows [M/2, M) hold stale values
// until, well after the launch, a copy engine writes the right ones and then raises their flag
// (M = 1024, or 128 for the instantiations of one tile row, whose one tile then reads both halves from
// the gathered buffer). The kernel must still be running when the flag goes up (it waits) and must
// then read the new rows.
TEST(FusedKernel, EveryInstantiationWaitsForItsRowsFlag) {
  REQUIRE_GPUS(1);
  RUN_RANKS(1, [](RankContext& ctx) {
    auto comm = make_comm(ctx);
    TwoRankFlags two;
    cudaStream_t s = two.s, copier = two.copier;
    reference::Fp32Gemm fp32;
    constexpr int64_t N = 768, K = 512;
    int n = 0;
    for (DType dt : {DType::kBF16, DType::kFP16})
      for (bool col : {false, true})
        for (const auto& [tile_n, M] : {std::pair<int, int64_t>{kernels::fused::kOneRowTileN, 128}, {192, 1024},
                                       {256, 1024}, {kernels::fused::kWideTileN, 1024},
                                       {kernels::fused::kPingpongTileN, 1024}}) {
          const int64_t m = M / 2;
          const size_t es = dtype_size(dt);
          const uint64_t seed = next_case_seed();
          Buf a(M * K * es), gathered(M * K * es), b(K * N * es), out(M * N * es);
          Buf a32(M * K * 4), b32(K * N * 4), ref(M * N * 4);
          reference::fill(a.p, dt, M, K, false, GenMatrix{seed, 0, 0}, 0, 0, s);
          reference::fill(gathered.p, dt, M, K, false, GenMatrix{seed + 1, 0, 0}, 0, 0, s);  // stale rows
          reference::fill(b.p, dt, K, N, col, GenMatrix{7, 0, 0}, 0, 0, s);
          reference::fill_fp32(a32.f(), M, K, GenMatrix{seed, 0, 0}, 0, 0, s);
          reference::fill_fp32(b32.f(), K, N, GenMatrix{7, 0, 0}, 0, 0, s);
          fp32.run(a32.f(), b32.f(), ref.f(), M, N, K, s);
          reference::poison(out.p, M * N * es, s);
          two.reset();
          if (M <= kernels::fused::kTileRows) {
            // The one tile holds both halves, so it reads the local rows from the gathered buffer too,
            // after their flag, as the op has them there (its own shard copied in, its flag raised).
            RANK_CUDA(cudaMemcpyAsync(gathered.p, a.p, m * K * es, cudaMemcpyDeviceToDevice, s));
            two.raise_own();
          }
          RANK_CUDA(cudaStreamSynchronize(s));

          kernels::fused::FusedGemmArgs g;
          g.dtype = element_of(dt);
          g.b_layout = col ? Layout::kColMajor : Layout::kRowMajor;
          g.M = M, g.N = N, g.K = K;
          g.a = gathered.p, g.b = b.p, g.c = out.p;
          g.tile_n = tile_n;
          const std::string what = std::string(dtype_name(dt)) + (col ? " B=col" : " B=row") + " tiles 128x" +
                                   std::to_string(tile_n) + (M > kernels::fused::kTileRows && tile_n == 128 ? " ping-pong" : "");
          two.launch_waiting(*comm, g, a.p, m, what);
          const char* src = static_cast<const char*>(a.p) + m * K * es;
          char* dst = static_cast<char*>(gathered.p) + m * K * es;
          RANK_CUDA(cudaMemcpyAsync(dst, src, m * K * es, cudaMemcpyDeviceToDevice, copier));
          two.raise_peer();
          const auto cmp = reference::compare(out.p, dt, M, N, ref.f(), N, 0, 0, 1.0f, reference::tolerance(dt, 1), s);
          RANK_CHECK(cmp.ok(), what, ": ", cmp.bad, " bad elements, max err ", cmp.max_abs_err, cmp.where());
          ++n;
        }
    std::printf("%d instantiations waited for their rows\n", n);
    return 0;
  });
}

// fp8's row-wise instantiations (the cooperative kernel's, one-CTA clusters', the ping-pong's two) as the
// all-gather's GEMM of two "ranks", as above, with A's row scales gathered like its rows: the scales of
// rows [M/2, M) are wrong until the copy engine writes the right ones, with the rows, and raises their
// flag. The cooperative kernel's epilogue warp reads a tile's scales a tile ahead of its stores
// (row_scale_epilogue.cuh); it must wait for the flag too. On two SMs, every CTA walks its own tiles
// and then the peer's, so the epilogue warp comes to a peer's tile while the mainloop still waits.
TEST(FusedKernel, RowWiseScalesWaitForTheirRowsFlag) {
  REQUIRE_GPUS(1);
  RUN_RANKS(1, [](RankContext& ctx) {
    auto comm = make_comm(ctx);
    TwoRankFlags two;
    cudaStream_t s = two.s, copier = two.copier;
    reference::Fp32Gemm fp32;
    constexpr int64_t N = 768, K = 512;
    constexpr DType dt = DType::kFP8E4M3;
    for (const auto& [tile_n, M] : {std::pair<int, int64_t>{256, 1024}, {kernels::fused::kOneRowTileN, 128},
                                   {kernels::fused::kPingpongTileN, 1024}, {kernels::fused::kPingpongWideTileN, 1024}}) {
      const int64_t m = M / 2;
      const uint64_t seed = next_case_seed();
      const GenMatrix ga{seed, 0, 0}, gb{seed + 1, 0, 0};
      Buf a(M * K), gathered(M * K), b(K * N), out(M * N * 2);
      Buf scales(M * sizeof(float)), gathered_scales(M * sizeof(float)), col_scales(N * sizeof(float));
      Buf a32(M * K * 4), b32(K * N * 4), ref(M * N * 4);
      reference::fill(a.p, dt, M, K, false, ga, 0, 0, s);
      reference::fill(gathered.p, dt, M, K, false, GenMatrix{seed + 2, 0, 0}, 0, 0, s);  // stale rows
      reference::fill(b.p, dt, K, N, true, gb, 0, 0, s);
      fill_row_scales<<<32, 256, 0, s>>>(scales.f(), M, 7);
      fill_row_scales<<<32, 256, 0, s>>>(gathered_scales.f(), M, 3);  // stale scales
      fill_row_scales<<<32, 256, 0, s>>>(col_scales.f(), N, 5);
      RANK_CUDA(cudaGetLastError());
      reference::fill_fp32_as(a32.f(), dt, M, K, ga, 0, 0, s);
      reference::fill_fp32_as(b32.f(), dt, K, N, gb, 0, 0, s);
      reference::scale(a32.f(), M, K, scales.f(), M, nullptr, 1, s);
      reference::scale(b32.f(), K, N, nullptr, 1, col_scales.f(), N, s);
      fp32.run(a32.f(), b32.f(), ref.f(), M, N, K, s);
      reference::poison(out.p, M * N * 2, s);
      two.reset();
      // This rank's rows' scales are in the gathered copy before the kernel, as the op puts them there.
      RANK_CUDA(cudaMemcpyAsync(gathered_scales.p, scales.p, m * sizeof(float), cudaMemcpyDeviceToDevice, s));
      if (M <= kernels::fused::kTileRows) {  // the one tile reads its local rows from the gathered buffer
        RANK_CUDA(cudaMemcpyAsync(gathered.p, a.p, m * K, cudaMemcpyDeviceToDevice, s));
        two.raise_own();
      }
      RANK_CUDA(cudaStreamSynchronize(s));

      kernels::fused::FusedGemmArgs g;
      g.dtype = Element::kFP8E4M3;
      g.out = Element::kBF16;
      g.b_layout = Layout::kColMajor;
      g.M = M, g.N = N, g.K = K;
      g.a = gathered.p, g.b = b.p, g.c = out.p;
      g.row_scales = gathered_scales.f(), g.col_scales = col_scales.f();
      g.tile_n = tile_n;
      two.launch_waiting(*comm, g, a.p, m, "fp8 row-wise tiles 128x" + std::to_string(tile_n) + " M=" + std::to_string(M),
                         /*sms=*/2);
      RANK_CUDA(cudaMemcpyAsync(static_cast<char*>(gathered.p) + m * K, static_cast<const char*>(a.p) + m * K, m * K,
                                cudaMemcpyDeviceToDevice, copier));
      RANK_CUDA(cudaMemcpyAsync(gathered_scales.f() + m, scales.f() + m, m * sizeof(float), cudaMemcpyDeviceToDevice, copier));
      two.raise_peer();
      const auto cmp = reference::compare(out.p, DType::kBF16, M, N, ref.f(), N, 0, 0, 1.0f,
                                          reference::fast_accum_tolerance(DType::kBF16, 1, K), s);
      RANK_CHECK(cmp.ok(), "fp8 row-wise tiles 128x", tile_n, " M=", M, ": ", cmp.bad, " bad elements, max err ",
                 cmp.max_abs_err, cmp.where());
    }
    return 0;
  });
}

// The scheduler and fixup() find a reduce-scatter tile's rank and chunk with cutlass::FastDivmod; the
// epilogue counts and waits with plain division. A tile counted into another chunk than its own
// leaves that chunk's count short and its push waiting until the timeout. No GPU needed.
TEST(FusedKernel, TileRowsMapToTheSameRankAndChunkByEitherDivision) {
  using kernels::fused::ReduceScatterTiles;
  int checked = 0;
  for (const int world : {2, 3, 4, 8}) {
    for (const int m : {256, 1536, 4096, 8192, 12288, 65536}) {
      for (const int chunk_rows : {128, 256, 384, 512, 2048, 4096}) {
        if (chunk_rows > m || (m + chunk_rows - 1) / chunk_rows > static_cast<int>(kMaxChunksPerRank)) continue;
        for (int rank = 0; rank < world; ++rank) {
          ReduceScatterTiles rs;
          rs.rank = rank, rs.world = world, rs.rows_per_rank = m, rs.rows_per_chunk = chunk_rows;
          const cutlass::FastDivmod by_rank(m), by_chunk(chunk_rows);
          for (int row0 = 0; row0 < world * m; row0 += static_cast<int>(kernels::fused::kTileRows)) {
            const int owner = row0 / m, chunk = row0 % m / chunk_rows;
            ASSERT_EQ(rs.staged_index(row0), owner * static_cast<int>(kMaxChunksPerRank) + chunk) << row0;
            ASSERT_EQ(rs.staged_index(row0, by_rank, by_chunk), rs.staged_index(row0)) << world << " " << m << " " << row0;
            ASSERT_EQ(rs.chunk_of(row0), chunk);
            ASSERT_EQ(rs.is_staged(row0, by_rank), owner != rank);
            ASSERT_EQ(rs.is_staged(row0), owner != rank);
            ++checked;
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 50000);
}

// The one word in which the scheduler's tile info keeps a tile's split and staged run (so that the
// consumers hold one register for them across the mainloop), as fixup() and the reduce-scatter's
// epilogue read it back: the epilogue takes reduction_subtile_idx() as (tiles to count << 1) | (an own
// tile comes next), and -1 for every tile it must store whole.
TEST(FusedKernel, TileInfoBitsCarryTheSplitAndTheStagedRun) {
  using Info = kernels::fused::AsyncInputTileScheduler<cutlass::bfloat16_t>::WorkTileInfo;
  Info w;
  EXPECT_FALSE(w.is_valid());
  EXPECT_EQ(w.split(), 0);
  EXPECT_EQ(w.splits(), 1);
  EXPECT_TRUE(w.is_final_split(0));
  EXPECT_FALSE(w.staged());
  EXPECT_EQ(w.reduction_subtile_idx(), -1);
  for (uint32_t split = 0; split < static_cast<uint32_t>(kernels::fused::kMaxTailSplits); ++split) {
    w.bits = split | static_cast<uint32_t>(kernels::fused::kMaxTailSplits) << Info::kSplitsShift | Info::kStaged;
    EXPECT_EQ(w.split(), static_cast<int32_t>(split));
    EXPECT_EQ(w.splits(), kernels::fused::kMaxTailSplits);
    EXPECT_TRUE(w.staged());
    EXPECT_EQ(w.run(), 0u);
    EXPECT_EQ(w.staged_count(), 0u);
    EXPECT_EQ(w.reduction_subtile_idx(), -1) << "a staged tile without a run is not one the consumers visited";
  }
  const uint32_t staged_whole = 1u << Info::kSplitsShift | Info::kStaged;
  w.bits = staged_whole | 5u << Info::kRunShift;  // the fifth of a run, which leaves the count to a later tile
  EXPECT_EQ(w.run(), 5u);
  EXPECT_EQ(w.staged_count(), 0u);
  EXPECT_FALSE(w.own_next());
  EXPECT_EQ(w.reduction_subtile_idx(), 0);
  w.bits |= Info::kReleases | Info::kOwnNext;  // ... or counts all five, before an own tile
  EXPECT_EQ(w.staged_count(), 5u);
  EXPECT_TRUE(w.own_next());
  EXPECT_EQ(w.reduction_subtile_idx(), 5 << 1 | 1);
  EXPECT_EQ(w.split(), 0);
  EXPECT_EQ(w.splits(), 1);
  w.bits = staged_whole | Info::kReleases | Info::kMaxRun << Info::kRunShift;  // the longest run a word holds
  EXPECT_EQ(w.staged_count(), Info::kMaxRun);
  EXPECT_EQ(w.splits(), 1);
  EXPECT_TRUE(w.staged());
}

}  // namespace
}  // namespace asynctp
