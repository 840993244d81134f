// The fused algorithm's host-side choices: the tile width per shape, the chunks per rank, and where the
// reduce-scatter stages its tiles.
#include <cstdlib>
#include <string>
#include <utility>

#include <gtest/gtest.h>

#include "algo/fused.h"
#include "asynctp/error.h"
#include "kernels/fused/fused_gemm.h"
#include "kernels/fused/staged_layout.h"
#include "kernels/fused/tail_split.h"
#include "kernels/fused/tile_order.h"

namespace asynctp {
namespace {

using kernels::fused::kMaxTailSplits;
using kernels::fused::pick_tile_n;
using kernels::fused::plan_tail_split;
using kernels::fused::tail_split_rounds;

TEST(FusedPlan, TileWidthWithoutSplitsFillsTheLastRoundOfTiles) {
  // 132 SMs (H100 SXM, H200): 66 clusters of two 128-row tiles. At 4096 x 3584, 256-wide tiles make
  // 224 cluster tiles: 3.4 rounds, so 4; 192-wide make 304: 4.6 rounds, so 5, each 3/4 as long (960
  // against 1024).
  EXPECT_EQ(pick_tile_n(4096, 3584, 8192, 132, 1), 192);
  // 7 rounds of 256 against 9 of 192: 3.6% less, under the 5% margin (192 measured slower there);
  // 2 rounds against 3; 32 against 42 (1.6% less): the wide tile stays.
  EXPECT_EQ(pick_tile_n(4096, 6656, 16384, 132, 1), 256);
  EXPECT_EQ(pick_tile_n(2048, 3584, 8192, 132, 1), 256);
  EXPECT_EQ(pick_tile_n(16384, 8192, 8192, 132, 1), 256);
}

TEST(FusedPlan, AProblemOfOneTileRowTakesItsOwnTiles) {
  // One-CTA clusters of 128 x 128 tiles (tile_shape.h), whatever N and K; one row more is two tile rows.
  EXPECT_EQ(pick_tile_n(128, 4096, 4096, 132, kMaxTailSplits), kernels::fused::kOneRowTileN);
  EXPECT_EQ(pick_tile_n(1, 7168, 2048, 132, 1), kernels::fused::kOneRowTileN);
  EXPECT_NE(pick_tile_n(129, 4096, 4096, 132, kMaxTailSplits), kernels::fused::kOneRowTileN);
}

TEST(FusedPlan, ThePingpongScheduleTakesOneClusterTileAClusterIn16BitsAndThreeInFp8) {
  using kernels::fused::pingpong_takes;
  constexpr Element kBF16 = Element::kBF16, kFP8 = Element::kFP8E4M3;
  // 66 clusters. In fp8, 1024 x 5120 makes 4 x 40 = 160 cluster tiles 128 wide (2.4 a cluster) and
  // 2048 x 3584 makes 8 x 28 = 224 (3.4): the ping-pong's is measured faster at the first, the
  // cooperative 256-wide at the second. In bf16 the ping-pong's is faster up to one a cluster (512 x
  // 4096: 64) and slower at 512 x 5120 (80) (docs/performance.md).
  EXPECT_TRUE(pingpong_takes(1024, 5120, 132, kFP8));
  EXPECT_TRUE(pingpong_takes(1536, 4224, 132, kFP8));   // 6 x 33 = 198, three a cluster
  EXPECT_FALSE(pingpong_takes(1536, 4352, 132, kFP8));  // 6 x 34 = 204
  EXPECT_FALSE(pingpong_takes(2048, 3584, 132, kFP8));
  EXPECT_TRUE(pingpong_takes(512, 4096, 132, kBF16));
  EXPECT_TRUE(pingpong_takes(256, 8448, 132, kBF16));   // 66: one a cluster
  EXPECT_FALSE(pingpong_takes(256, 8576, 132, kBF16));  // 67
  EXPECT_FALSE(pingpong_takes(512, 5120, 132, kBF16));
  EXPECT_FALSE(pingpong_takes(16384, 8192, 132, kFP8));
  EXPECT_FALSE(pingpong_takes(128, 8192, 132, kFP8));   // one tile row: its own instantiation
  EXPECT_TRUE(pingpong_takes(512, 4096, 66, kFP8));     // half the SMs (two ranks on one GPU): 64 <= 99
  EXPECT_FALSE(pingpong_takes(1024, 4096, 66, kFP8));   // 128
}

TEST(FusedPlan, AnOddNumberOfTileRowsWithinARoundTakesOneCtaClusters) {
  using kernels::fused::one_cta_takes;
  EXPECT_TRUE(one_cta_takes(384, 4096, 132, Element::kBF16));   // 3 x 32 = 96 tiles of 128 x 128
  EXPECT_TRUE(one_cta_takes(300, 520, 132, Element::kFP16));    // 3 x 5, ragged
  EXPECT_TRUE(one_cta_takes(640, 2048, 132, Element::kBF16));   // 5 x 16
  EXPECT_FALSE(one_cta_takes(512, 4096, 132, Element::kBF16));  // 4 tile rows: whole 2 x 1 clusters
  EXPECT_FALSE(one_cta_takes(384, 8192, 132, Element::kBF16));  // 192 tiles: more than a round
  EXPECT_FALSE(one_cta_takes(128, 4096, 132, Element::kBF16));  // one tile row: its own rule
  EXPECT_FALSE(one_cta_takes(384, 4096, 132, Element::kFP8E4M3));
}

TEST(FusedPlan, TileWidthCountsTheSplitLastRound) {
  // 4096 x 3584: 256-wide, 3 rounds and 26 tiles split 2 ways (3.5 x 256 = 896) against 192-wide, 4
  // rounds and 40 tiles, too many to split (5 x 192 = 960).
  EXPECT_EQ(pick_tile_n(4096, 3584, 8192, 132, kMaxTailSplits), 256);
  // 2048 x 3584: 256-wide, 1 round and 46 tiles (2 x 256 = 512) against 192-wide, 2 rounds and 20
  // tiles split 3 ways (2 + 1/3 + 2 x 12 / 128 = 2.52 rounds; 484).
  EXPECT_EQ(pick_tile_n(2048, 3584, 8192, 132, kMaxTailSplits), 192);
  // 6 rounds and 20 tiles split 3 ways (1645) against 8 rounds and 32 split 2 ways (1641).
  EXPECT_EQ(pick_tile_n(4096, 6656, 16384, 132, kMaxTailSplits), 256);
  EXPECT_EQ(pick_tile_n(16384, 8192, 8192, 132, kMaxTailSplits), 256);
  // 512 x 7168 x 2048: one round of 56 tiles 256 wide against 76 192-wide, whose 10 after the full
  // round would split only at a loss in 32 steps along K: 256 (measured 32 µs against 41).
  EXPECT_EQ(pick_tile_n(512, 7168, 2048, 132, kMaxTailSplits), 256);
}

TEST(FusedPlan, TheWidestTilesTakeShapesTheyFitInFewerWholeRounds) {
  using kernels::fused::kWideTileN;
  // 1024 x 5120 x 5120: 64 tiles 320 wide, one round (320 x 1.1 = 352), against two rounds of 108 tiles
  // 192 wide (384) or a round and 14 split 3 ways 256 wide (418).
  EXPECT_EQ(pick_tile_n(1024, 5120, 5120, 132, kMaxTailSplits), kWideTileN);
  EXPECT_EQ(pick_tile_n(1280, 4096, 4096, 132, kMaxTailSplits), kWideTileN);  // 65 tiles
  EXPECT_EQ(pick_tile_n(1024, 5120, 2048, 132, kMaxTailSplits), kWideTileN);
  // Not where its tiles would be split (512 x 5120: 32 tiles split 2 ways, measured slower than one
  // round of 54 192-wide ones), nor where a round of them is not 5% shorter counted 1.1 times its width
  // (768 x 6656 x 16384: 63 tiles, 352 against 256-wide's 356), nor at the seeds.
  EXPECT_EQ(pick_tile_n(512, 5120, 5120, 132, kMaxTailSplits), 192);
  EXPECT_EQ(pick_tile_n(768, 6656, 16384, 132, kMaxTailSplits), 256);
  EXPECT_EQ(pick_tile_n(2560, 4096, 4096, 132, kMaxTailSplits), 256);
  for (const auto& [M, N, K] : {std::tuple{4096, 3584, 8192}, {2048, 3584, 8192}, {4096, 6656, 16384},
                                {16384, 8192, 8192}, {8192, 8192, 8192}}) {
    EXPECT_NE(pick_tile_n(M, N, K, 132, kMaxTailSplits), kWideTileN) << M << "x" << N << "x" << K;
  }
  // Fewer SMs: 1024 x 896 in 4 steps of K on 30, 4 x 3 tiles in one round.
  EXPECT_EQ(pick_tile_n(1024, 896, 256, 30, kMaxTailSplits), kWideTileN);
  // Only without peers: with one, an all-gather's or a reduce-scatter's kernel takes 192 or 256.
  EXPECT_EQ(pick_tile_n(1024, 5120, 5120, 132, kMaxTailSplits, false), 192);
  using kernels::fused::tile_n_above_one_row;
  EXPECT_EQ(tile_n_above_one_row(1024, 5120, 5120, 132, Element::kBF16, kMaxTailSplits, true, false), 192);
  using kernels::fused::reduce_scatter_tile_n;
  EXPECT_EQ(reduce_scatter_tile_n(false, Element::kBF16, 1024, 5120, 5120, 1024, 132), kWideTileN);
  EXPECT_EQ(reduce_scatter_tile_n(false, Element::kBF16, 1024, 5120, 5120, 512, 132), 192);
}

// fp8 takes the ping-pong schedule at every size where K < kFp8PingpongBelowK, and 256-wide cooperative
// tiles from there on beyond three cluster tiles a cluster; 16-bit problems are not affected.
TEST(FusedPlan, Fp8TakesThePingpongScheduleAtEverySizeBelowItsK) {
  using kernels::fused::kFp8PingpongBelowK;
  using kernels::fused::kPingpongTileN;
  using kernels::fused::tile_n_above_one_row;
  constexpr Element kFP8 = Element::kFP8E4M3;
  for (const auto& [M, N] : {std::pair<int64_t, int64_t>{16384, 8192}, {4096, 8192}, {8192, 3584}, {6144, 5120}}) {
    for (const int64_t K : {int64_t{1024}, int64_t{4096}, kFp8PingpongBelowK - 16}) {
      EXPECT_EQ(tile_n_above_one_row(M, N, K, 132, kFP8, kMaxTailSplits, true, true), kPingpongTileN) << M << "x" << N << "x" << K;
    }
    for (const int64_t K : {kFp8PingpongBelowK, int64_t{16384}}) {
      EXPECT_EQ(tile_n_above_one_row(M, N, K, 132, kFP8, kMaxTailSplits, true, true), 256) << M << "x" << N << "x" << K;
    }
  }
  EXPECT_EQ(tile_n_above_one_row(1024, 5120, 16384, 132, kFP8, kMaxTailSplits, true, true), kPingpongTileN);  // 160 tiles
  // At K = 8192 where the 256-wide tiles fill less than 90% of their rounds and 128-wide ones more.
  using kernels::fused::fp8_pingpong_fills_better;
  EXPECT_TRUE(fp8_pingpong_fills_better(4096, 3584, 8192, 132));    // 0.85 against 0.97
  EXPECT_TRUE(fp8_pingpong_fills_better(6144, 3584, 8192, 132));    // 0.85 against 0.93
  EXPECT_FALSE(fp8_pingpong_fills_better(2048, 3584, 8192, 132));   // 0.85 against 0.85
  EXPECT_FALSE(fp8_pingpong_fills_better(4096, 4096, 8192, 132));   // 0.97 and 0.97
  EXPECT_FALSE(fp8_pingpong_fills_better(4096, 3584, 16384, 132));  // not past K = 8192
  EXPECT_EQ(tile_n_above_one_row(4096, 3584, 8192, 132, kFP8, kMaxTailSplits, true, true), kPingpongTileN);
  EXPECT_EQ(tile_n_above_one_row(4096, 3584, 8192, 132, Element::kBF16, kMaxTailSplits, true, true),
            pick_tile_n(4096, 3584, 8192, 132, kMaxTailSplits));  // 16 bits: not affected
  EXPECT_NE(tile_n_above_one_row(16384, 8192, 4096, 132, Element::kBF16, kMaxTailSplits, true, true), kPingpongTileN);
}

// fp8's row-wise all-gather runs 192-wide ping-pong tiles where they fill at least 98% of their rounds
// (66 clusters), or 90% at K of 8192 and less: measured faster than the cooperative 256-wide tiles at
// the true cases, slower at the false ones but the ragged M.
TEST(FusedPlan, Fp8RowWisePingpong192TakesNearlyFullRounds) {
  using kernels::fused::pingpong_192_takes;
  EXPECT_TRUE(pingpong_192_takes(8192, 8192, 8192, 132));     // 32 x 43 = 1376 tiles, 21 rounds: 0.985 filled
  EXPECT_TRUE(pingpong_192_takes(16384, 8192, 8192, 132));    // 64 x 43 = 2752, 42 rounds: 0.985
  EXPECT_TRUE(pingpong_192_takes(8192, 8192, 16384, 132));    // 0.985 at any K
  EXPECT_TRUE(pingpong_192_takes(3072, 4224, 8192, 132));     // 12 x 22 = 264, four whole rounds
  EXPECT_FALSE(pingpong_192_takes(16384, 4096, 14336, 132));  // 64 x 22 = 1408, 22 rounds: 0.940
  EXPECT_FALSE(pingpong_192_takes(4096, 6656, 16384, 132));   // 0.934
  EXPECT_TRUE(pingpong_192_takes(4096, 3584, 8192, 132));     // 0.905, at K = 8192
  EXPECT_TRUE(pingpong_192_takes(8192, 4096, 8192, 132));     // 0.940
  EXPECT_TRUE(pingpong_192_takes(12288, 8192, 8192, 132));    // 0.970
  EXPECT_FALSE(pingpong_192_takes(4096, 3584, 8192 + 16, 132));  // the same rounds past K = 8192
  EXPECT_FALSE(pingpong_192_takes(2048, 3584, 8192, 132));    // 0.75
  EXPECT_FALSE(pingpong_192_takes(3000, 4224, 16384, 132));   // ragged M: 0.977
  EXPECT_FALSE(pingpong_192_takes(128, 192 * 66, 8192, 132)); // one tile row: its own instantiation
  EXPECT_TRUE(pingpong_192_takes(3072, 4224, 16384, 66));     // half the SMs: eight whole rounds
}

// The all-gather's launch asks that rule only for row-wise fp8 where the others give 256-wide tiles.
TEST(FusedPlan, TheAllGathersLaunchTakes192WidePingpongTilesForRowWiseFp8Only) {
  using kernels::fused::FusedGemmArgs;
  using kernels::fused::tile_n_for;
  static const float scales[4] = {};
  auto args = [](int64_t M, int64_t N, int64_t K, bool row_wise) {
    FusedGemmArgs a;
    a.dtype = Element::kFP8E4M3;
    a.b_layout = Layout::kColMajor;
    a.M = M, a.N = N, a.K = K;
    if (row_wise) a.row_scales = a.col_scales = scales;
    return a;
  };
  EXPECT_EQ(tile_n_for(args(8192, 8192, 8192, true), 132), kernels::fused::kPingpongWideTileN);
  EXPECT_EQ(tile_n_for(args(8192, 8192, 8192, false), 132), 256);         // tensor-wise
  EXPECT_EQ(tile_n_for(args(16384, 4096, 14336, true), 132), 256);        // 0.94 filled
  EXPECT_EQ(tile_n_for(args(8192, 4096, 8192, true), 132), kernels::fused::kPingpongWideTileN);    // 0.94 filled
  EXPECT_EQ(tile_n_for(args(4096, 3584, 8192, true), 132), kernels::fused::kPingpongTileN);  // fills 128-wide better
  EXPECT_EQ(tile_n_for(args(1024, 6336, 8192, true), 132), kernels::fused::kPingpongWideTileN);  // the kernel test's
  EXPECT_EQ(tile_n_for(args(6144, 3584, 8192, true), 132), kernels::fused::kPingpongWideTileN);  // 0.97 against 0.93
  EXPECT_EQ(tile_n_for(args(6144, 3584, 8192, false), 132), kernels::fused::kPingpongTileN);     // tensor-wise
  EXPECT_EQ(tile_n_for(args(2048, 3584, 8192, true), 132), 256);          // 0.75 filled
  EXPECT_EQ(tile_n_for(args(8192, 8192, 4096, true), 132), kernels::fused::kPingpongTileN);  // K < 8192
  EXPECT_EQ(tile_n_for(args(128, 8192, 8192, true), 132), kernels::fused::kOneRowTileN);
}

TEST(FusedPlan, Cooperative192WideTilesTakeLessThanARoundSplitThreeWaysOrMore) {
  using kernels::fused::split_192_takes;
  // 256 x 4096 x 4096: 22 tiles split 3 ways (66 units on 66 clusters) along 64 K steps.
  EXPECT_TRUE(split_192_takes(256, 4096, 4096, 132, kMaxTailSplits));
  using kernels::fused::tile_n_above_one_row;
  EXPECT_EQ(tile_n_above_one_row(256, 4096, 4096, 132, Element::kBF16, kMaxTailSplits, true, true), 192);
  // Ahead of the estimate, which alone would take 256 (16 tiles split 4 ways: as long as 22 split 3).
  EXPECT_EQ(pick_tile_n(256, 4096, 4096, 132, kMaxTailSplits), 256);
  // Where this rank's rows straddle a tile (the all-gather's), not 192, and here the ping-pong's.
  EXPECT_EQ(tile_n_above_one_row(256, 4096, 4096, 132, Element::kBF16, kMaxTailSplits, false, true),
            kernels::fused::kPingpongTileN);
  EXPECT_TRUE(split_192_takes(256, 2048, 4096, 132, kMaxTailSplits));  // 11 tiles, 4 ways
  EXPECT_TRUE(split_192_takes(256, 4096, 8192, 132, kMaxTailSplits));
  EXPECT_TRUE(split_192_takes(512, 2048, 4096, 132, kMaxTailSplits));  // 2 x 11 tiles, 3 ways
  EXPECT_FALSE(split_192_takes(256, 4096, 2048, 132, kMaxTailSplits));  // 32 K steps
  EXPECT_FALSE(split_192_takes(256, 5120, 5120, 132, kMaxTailSplits));  // 27 tiles: 2 ways
  EXPECT_FALSE(split_192_takes(256, 8192, 8192, 132, kMaxTailSplits));  // 43 tiles: not split
  EXPECT_FALSE(split_192_takes(512, 4096, 4096, 132, kMaxTailSplits));  // 44 tiles: not split
  EXPECT_FALSE(split_192_takes(128, 4096, 4096, 132, kMaxTailSplits));  // one tile row: its own rule
  EXPECT_FALSE(split_192_takes(256, 4096, 4096, 132, 1));               // nothing split
}

TEST(FusedPlan, AReduceScattersRowWiseScalesComeInPairsInPlaceOfAPartialScaleAndInFp8Only) {
  using kernels::fused::fused_gemm_unsupported;
  alignas(16) static float scales[64];
  alignas(16) static char data[64];
  kernels::fused::FusedGemmArgs g;
  g.dtype = Element::kFP8E4M3, g.b_layout = Layout::kColMajor;
  g.M = 256, g.N = 256, g.K = 256;
  g.a = g.b = data, g.c = data;
  g.rs.rank = 0, g.rs.world = 2;
  g.rs.row_scales = scales, g.rs.col_scales = scales + 16, g.rs.cols = 256;
  EXPECT_STREQ(fused_gemm_unsupported(g), "");
  g.rs.col_scales = nullptr;
  EXPECT_STRNE(fused_gemm_unsupported(g), "");
  g.rs.col_scales = scales + 16, g.rs.partial_scale = scales;
  EXPECT_STRNE(fused_gemm_unsupported(g), "");
  g.rs.partial_scale = nullptr, g.dtype = Element::kBF16, g.b_layout = Layout::kRowMajor;
  EXPECT_STREQ(fused_gemm_unsupported(g), "the fused kernel takes row-wise scales for fp8 only");
}

TEST(FusedPlan, AnFp8ProductIsBf16OrFp16AndA16BitOneItsInputs) {
  using kernels::fused::fused_gemm_unsupported;
  alignas(16) static char data[64];
  kernels::fused::FusedGemmArgs g;
  g.dtype = Element::kFP8E4M3, g.b_layout = Layout::kColMajor;
  g.M = 256, g.N = 256, g.K = 256;
  g.a = g.b = data, g.c = data;
  for (Element out : {Element::kBF16, Element::kFP16}) {
    g.out = out;
    EXPECT_STREQ(fused_gemm_unsupported(g), "");
  }
  g.out = Element::kFP8E4M3;
  EXPECT_STREQ(fused_gemm_unsupported(g), "the fused kernel's fp8 product is bf16 or fp16");
  g.dtype = Element::kFP16, g.b_layout = Layout::kRowMajor;  // 16-bit inputs give their own, whatever `out` says
  EXPECT_STREQ(fused_gemm_unsupported(g), "");
}

TEST(FusedPlan, ATailAfterFullRoundsSplitsOnlyWhereKIsDeepEnough) {
  using kernels::fused::split_tail_rounds;
  // Each split beyond the first costs 12 K steps after full rounds, nothing in a problem of one round.
  EXPECT_DOUBLE_EQ(split_tail_rounds(3, 256, true), 1.0 / 3.0 + 24.0 / 256.0);
  EXPECT_DOUBLE_EQ(split_tail_rounds(3, 256, false), 1.0 / 3.0);
  // 768 x 7168 x 2048, 256 wide: 84 tiles, 18 after a full round, 32 steps: 2 ways is 0.875 of a round.
  EXPECT_EQ(plan_tail_split(84, 66, 32).splits, 1);
  EXPECT_DOUBLE_EQ(tail_split_rounds(plan_tail_split(84, 66, 32), 66), 2.0);
  // 1024 x 5120 x 5120, 256 wide: 14 after a full round, 80 steps: 3 ways (0.63) is shorter than 2
  // (0.65) or 4 (0.70).
  const auto s = plan_tail_split(80, 66, 80);
  EXPECT_EQ(s.splits, 3);
  EXPECT_DOUBLE_EQ(tail_split_rounds(s, 66), 1.0 + 1.0 / 3.0 + 24.0 / 80.0);
  // Less than one round: as far as allowed, however shallow (16 steps: 4 ways).
  EXPECT_EQ(plan_tail_split(16, 66, 16).splits, kMaxTailSplits);
}

TEST(FusedPlan, TailSplitTakesOnlyALastRoundAtMostHalfFull) {
  // 4096 x 6656 with 128 x 256 tiles: 416 cluster tiles on 66 clusters, 256 steps along K.
  auto s = plan_tail_split(416, 66, 256);
  EXPECT_EQ(s.whole, 396);
  EXPECT_EQ(s.tail, 20);
  EXPECT_EQ(s.splits, 3);
  EXPECT_EQ(s.units(), 456);
  EXPECT_DOUBLE_EQ(tail_split_rounds(s, 66), 6.0 + 1.0 / 3.0 + 2.0 * 12.0 / 256.0);
  // One tile: split as far as allowed; and only as far as K has 4 steps per split.
  s = plan_tail_split(1, 66, 64);
  EXPECT_EQ(s.splits, kMaxTailSplits);
  EXPECT_EQ(plan_tail_split(1, 66, 9).splits, 2);
  EXPECT_EQ(plan_tail_split(1, 66, 7).splits, 1);
  // A last round more than half full, a full last round, and max_splits 1: nothing split.
  for (const auto& p : {plan_tail_split(112, 66, 128), plan_tail_split(132, 66, 128), plan_tail_split(20, 66, 128, 1)}) {
    EXPECT_EQ(p.splits, 1);
    EXPECT_EQ(p.tail, 0);
  }
  EXPECT_EQ(plan_tail_split(112, 66, 128).whole, 112);
  EXPECT_DOUBLE_EQ(tail_split_rounds(plan_tail_split(112, 66, 128), 66), 2.0);
}

TEST(FusedPlan, EverySplitOfTheTailRunsInTheLastRoundAndFitsTheWorkspace) {
  // What the scheduler relies on: the tail's units fit in one round (tail * splits <= clusters), the
  // whole tiles fill full rounds, and partial sums and counters fit a workspace sized by SM count.
  for (int64_t clusters : {1, 2, 33, 66, 67}) {
    for (int64_t tiles = 1; tiles < 5 * clusters; ++tiles) {
      for (int64_t k_tiles : {1, 8, 16, 1000}) {
        const auto s = plan_tail_split(tiles, clusters, k_tiles);
        ASSERT_EQ(s.whole + s.tail, tiles);
        if (s.splits == 1) continue;
        EXPECT_EQ(s.whole % clusters, 0);
        EXPECT_LE(s.tail * s.splits, clusters);
        EXPECT_LE(s.splits, kMaxTailSplits);
        EXPECT_GE(k_tiles / s.splits, kernels::fused::kMinKTilesPerSplit);
        const int64_t sms = 2 * clusters, ctas = 2;
        EXPECT_LE(s.tail * ctas, sms);
        EXPECT_LE(s.tail * ctas * (s.splits - 1), sms);
      }
    }
  }
}

TEST(FusedPlan, ChunksPerRank) {
  EXPECT_EQ(algo::resolve_fused_chunks(0, 2048), algo::kFusedDefaultChunks);
  EXPECT_EQ(algo::resolve_fused_chunks(3, 2048), 3);
  EXPECT_EQ(algo::resolve_fused_chunks(16, 5), 5);  // never more chunks than rows
  EXPECT_EQ(algo::resolve_fused_chunks(0, 1), 1);
}

TEST(FusedPlan, ReduceScatterChunksPerRank) {
  // Default: a chunk per 512 rows, 1 to 4; asked for: as many, up to the rows' 256-row clusters.
  EXPECT_EQ(algo::resolve_fused_rs_chunks(0, 256), 1);
  EXPECT_EQ(algo::resolve_fused_rs_chunks(0, 1024), 2);
  EXPECT_EQ(algo::resolve_fused_rs_chunks(0, 2048), 4);
  EXPECT_EQ(algo::resolve_fused_rs_chunks(0, 8192), 4);
  EXPECT_EQ(algo::resolve_fused_rs_chunks(3, 8192), 3);
  EXPECT_EQ(algo::resolve_fused_rs_chunks(16, 1024), 4);
  EXPECT_EQ(algo::resolve_fused_rs_chunks(2, 256), 1);
}

TEST(FusedPlan, ReduceScatterBandsNeverSpanTwoRanksOrChunks) {
  using kernels::fused::kClusterRows;
  using kernels::fused::kTileRows;
  using kernels::fused::reduce_scatter_band_m;
  EXPECT_EQ(reduce_scatter_band_m(2048, 512, kClusterRows), 2);
  EXPECT_EQ(reduce_scatter_band_m(8192, 2048, kClusterRows), 8);
  EXPECT_EQ(reduce_scatter_band_m(4096, 4096, kClusterRows), 8);
  // 1280 rows in chunks of 768 (5 and 3 cluster rows): a band of 3 would hold the last chunk's two
  // rows and the next rank's first.
  EXPECT_EQ(reduce_scatter_band_m(1280, 768, kClusterRows), 1);
  EXPECT_EQ(reduce_scatter_band_m(1536, 1536, kClusterRows), 6);
  EXPECT_EQ(reduce_scatter_band_m(256 * 14, 256 * 14, kClusterRows), 7);
  // One-CTA clusters count tile rows: 1152 rows (9) in chunks of 768 (6) make bands of 3.
  EXPECT_EQ(reduce_scatter_band_m(1152, 768, kTileRows), 3);
  EXPECT_EQ(reduce_scatter_band_m(128, 256, kTileRows), 1);
  for (int64_t cluster_rows : {kClusterRows, kTileRows}) {
    for (int64_t rank = 1; rank <= 40; ++rank) {
      for (int chunks = 1; chunks <= 4; ++chunks) {
        const int64_t chunk = (rank + chunks - 1) / chunks;
        const int band = reduce_scatter_band_m(rank * cluster_rows, chunk * cluster_rows, cluster_rows);
        EXPECT_EQ(rank % band, 0);
        EXPECT_EQ(chunk % band, 0);
        EXPECT_EQ((rank % chunk) % band, 0);  // the last, shorter chunk too
        EXPECT_LE(band, 8);
      }
    }
  }
}

TEST(FusedPlan, ReduceScatterChunksCoverTheRowsInWholeClusters) {
  using kernels::fused::RowChunks;
  const RowChunks even(2048, 4);  // 4096x3584x8192 on two ranks
  EXPECT_EQ(even.rows, 512);
  EXPECT_EQ(even.used, 4);
  EXPECT_EQ(even.begin(3), 1536);
  EXPECT_EQ(even.end(3, 2048), 2048);
  // 1280 rows in two chunks: 640 rounded up to whole 256-row clusters, so the second is shorter.
  const RowChunks uneven(1280, 2);
  EXPECT_EQ(uneven.rows, 768);
  EXPECT_EQ(uneven.used, 2);
  EXPECT_EQ(uneven.end(0, 1280), 768);
  EXPECT_EQ(uneven.end(1, 1280), 1280);
  // More chunks asked for than the rounding leaves: fewer are used, and none is empty.
  const RowChunks fewer(1280, 4);
  EXPECT_EQ(fewer.rows, 512);
  EXPECT_EQ(fewer.used, 3);
  EXPECT_LT(fewer.begin(2), fewer.end(2, 1280));
  // For every chunk count the op resolves to: the kernel's count of each chunk's tiles
  // (ReduceScatterTiles::tiles_in_chunk) covers the chunk's rows, and the chunks' tiles add up to the rank's.
  kernels::fused::ReduceScatterTiles rs;
  rs.tiles_n = 3;
  for (int32_t rows = 256; rows <= 256 * 40; rows += 256) {
    for (int asked = 1; asked <= 4; ++asked) {
      const RowChunks p(rows, algo::resolve_fused_rs_chunks(asked, rows));
      EXPECT_EQ(p.rows % kernels::fused::kClusterRows, 0);
      EXPECT_EQ(p.end(p.used - 1, rows), rows);
      EXPECT_LT(p.begin(p.used - 1), rows);
      rs.rows_per_rank = rows, rs.rows_per_chunk = static_cast<int32_t>(p.rows);
      uint32_t tiles = 0;
      for (int j = 0; j < p.used; ++j) {
        EXPECT_EQ(rs.rows_in_chunk(j), p.end(j, rows) - p.begin(j));
        tiles += rs.tiles_in_chunk(j);
      }
      EXPECT_EQ(tiles, static_cast<uint32_t>(rows / 128 * 3));
    }
  }
}

// fp8 with row-wise scales: the ping-pong schedule up to K = 8192 where the all-gather's rule gives the
// cooperative 256-wide tiles; not tensor-wise, not beyond, not where the ranks reduce in the epilogue.
TEST(FusedPlan, ARowWiseFp8ReduceScatterTakesThePingpongScheduleUpToK8192) {
  using kernels::fused::kPingpongTileN;
  using kernels::fused::reduce_scatter_tile_n;
  constexpr Element kFP8 = Element::kFP8E4M3;
  EXPECT_EQ(reduce_scatter_tile_n(false, kFP8, 16384, 8192, 8192, 16384, 132, true), kPingpongTileN);
  EXPECT_EQ(reduce_scatter_tile_n(false, kFP8, 8192, 8192, 8192, 2048, 132, true), kPingpongTileN);
  EXPECT_EQ(reduce_scatter_tile_n(false, kFP8, 16384, 8192, 8192, 16384, 132, false), 256);    // tensor-wise
  EXPECT_EQ(reduce_scatter_tile_n(false, kFP8, 16384, 4096, 14336, 16384, 132, true), 256);    // K = 14336
  EXPECT_EQ(reduce_scatter_tile_n(true, kFP8, 16384, 8192, 8192, 8192, 132, true), static_cast<int>(kernels::fused::kRsTileN));
  EXPECT_EQ(reduce_scatter_tile_n(false, Element::kBF16, 16384, 8192, 8192, 16384, 132, true), 256);
  EXPECT_EQ(algo::fused_rs_tile_n(1, DType::kFP8E4M3, 8192, 8192, 8192, 132, true), kPingpongTileN);
  EXPECT_EQ(algo::fused_rs_tile_n(1, DType::kFP8E4M3, 8192, 8192, 8192, 132), 256);
}

TEST(FusedPlan, AReduceScatterTakesNarrowerTilesOnlyWhereItReducesInFixup) {
  using kernels::fused::reduce_scatter_tile_n;
  // 512 x 5120 x 5120 on 132 SMs (256 rows on each of two ranks): 40 cluster tiles 256 wide on 66
  // clusters, 54 192 wide: one round either way, 3/4 as long in 192.
  EXPECT_EQ(reduce_scatter_tile_n(false, Element::kBF16, 512, 5120, 5120, 256, 132), 192);
  EXPECT_EQ(reduce_scatter_tile_n(true, Element::kBF16, 512, 5120, 5120, 256, 132), 256);  // the epilogue's
  EXPECT_EQ(reduce_scatter_tile_n(false, Element::kFP8E4M3, 2048, 8192, 8192, 1024, 132), 256);
  // 4096 x 3584 x 8192 on two ranks: 3.69 rounds 256 wide (the tail split 2 ways) against 5 192 wide.
  EXPECT_EQ(reduce_scatter_tile_n(false, Element::kBF16, 4096, 3584, 4096, 2048, 132), 256);
  // An odd number of tile rows a rank: 128-wide tiles in one-CTA clusters, in fp8 too.
  EXPECT_EQ(reduce_scatter_tile_n(false, Element::kBF16, 256, 4096, 4096, 128, 132), kernels::fused::kOneRowTileN);
  EXPECT_EQ(reduce_scatter_tile_n(false, Element::kFP8E4M3, 1152, 4096, 4096, 384, 132), kernels::fused::kOneRowTileN);
  EXPECT_TRUE(algo::fused_rs_takes_rows(128));
  EXPECT_TRUE(algo::fused_rs_takes_rows(384));
  EXPECT_FALSE(algo::fused_rs_takes_rows(130));
  EXPECT_EQ(algo::fused_rs_tile_n(2, DType::kBF16, 256, 4096, 4096, 132), kernels::fused::kOneRowTileN);
  // 108 cluster tiles 192 wide, two rounds, reduced in fixup(); not the one round of 320-wide ones,
  // which are for one rank only.
  EXPECT_EQ(algo::fused_rs_tile_n(2, DType::kBF16, 1024, 5120, 5120, 132), 192);
  EXPECT_EQ(algo::fused_rs_tile_n(1, DType::kBF16, 1024, 5120, 5120, 132), kernels::fused::kWideTileN);
  EXPECT_EQ(algo::fused_rs_tile_n(2, DType::kBF16, 16384, 8192, 4096, 132), 256);  // 4096 tiles: in the epilogue
}

// ASYNCTP_FUSED_TILE_N overrides a reduce-scatter's width where it reduces in fixup() and its rows a rank
// are whole 2 x 1 clusters: 128 (the ping-pong schedule), 256, and 192 in 16 bits only.
TEST(FusedPlan, AReduceScatterTakesTheForcedWidthWhereItReducesInFixup) {
  using kernels::fused::reduce_scatter_tile_n;
  ::setenv("ASYNCTP_FUSED_TILE_N", "128", 1);
  EXPECT_EQ(reduce_scatter_tile_n(false, Element::kFP8E4M3, 16384, 8192, 8192, 16384, 132), kernels::fused::kPingpongTileN);
  EXPECT_EQ(reduce_scatter_tile_n(true, Element::kBF16, 16384, 8192, 8192, 8192, 132), 256);  // the epilogue's
  ::setenv("ASYNCTP_FUSED_TILE_N", "256", 1);
  EXPECT_EQ(reduce_scatter_tile_n(false, Element::kBF16, 512, 5120, 5120, 256, 132), 256);
  EXPECT_EQ(reduce_scatter_tile_n(false, Element::kBF16, 256, 4096, 4096, 128, 132), kernels::fused::kOneRowTileN);
  ::setenv("ASYNCTP_FUSED_TILE_N", "192", 1);
  EXPECT_EQ(reduce_scatter_tile_n(false, Element::kBF16, 16384, 8192, 8192, 8192, 132), 192);
  EXPECT_EQ(reduce_scatter_tile_n(false, Element::kFP8E4M3, 2048, 8192, 8192, 1024, 132), 256);  // fp8: its own
  ::unsetenv("ASYNCTP_FUSED_TILE_N");
  EXPECT_EQ(reduce_scatter_tile_n(false, Element::kFP8E4M3, 16384, 8192, 8192, 16384, 132), 256);
}

TEST(FusedPlan, BothOpsRefuseAForcedWidthNoKernelHas) {
  using kernels::fused::forced_tile_n;
  using kernels::fused::reduce_scatter_tile_n;
  ::setenv("ASYNCTP_FUSED_TILE_N", "100", 1);
  try {
    reduce_scatter_tile_n(false, Element::kBF16, 16384, 8192, 8192, 8192, 132);
    ADD_FAILURE() << "the reduce-scatter took a width of 100";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ASYNCTP_FUSED_TILE_N is 100; expected 128, 192, 256 or 320"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(forced_tile_n(), Error);  // what the all-gather's launch reads
  // A width one op has and the other has not: the reduce-scatter keeps its own choice.
  ::setenv("ASYNCTP_FUSED_TILE_N", "320", 1);
  EXPECT_EQ(forced_tile_n(), 320);
  EXPECT_EQ(reduce_scatter_tile_n(false, Element::kBF16, 16384, 8192, 8192, 8192, 132), 256);
  ::unsetenv("ASYNCTP_FUSED_TILE_N");
  EXPECT_EQ(forced_tile_n(), 0);
}

TEST(FusedPlan, AReduceScatterOfAFewTilesTakesThePingpongScheduleAsAnAllGatherDoes) {
  using kernels::fused::kPingpongTileN;
  using kernels::fused::reduce_scatter_one_cta_clusters;
  using kernels::fused::reduce_scatter_tile_n;
  // 512 x 4096 x 4096 (two cluster rows by 32 tiles 128 wide: 64 on 66 clusters) and 256 x 7168 x 2048
  // (56), at 256 and 512 rows a rank: the all-gather's schedule of the same problem.
  for (int64_t rows : {256, 512}) {
    EXPECT_EQ(reduce_scatter_tile_n(false, Element::kBF16, 512, 4096, 4096, rows, 132), kPingpongTileN);
    EXPECT_EQ(reduce_scatter_tile_n(false, Element::kFP16, 512, 4096, 4096, rows, 132), kPingpongTileN);
    EXPECT_FALSE(reduce_scatter_one_cta_clusters(kPingpongTileN, rows));
  }
  EXPECT_EQ(reduce_scatter_tile_n(false, Element::kBF16, 256, 7168, 2048, 256, 132), kPingpongTileN);
  EXPECT_TRUE(kernels::fused::pingpong_takes(512, 4096, 132, Element::kBF16));
  // fp8 up to three cluster tiles a cluster, as its all-gather: 512 x 5120 x 5120 (80), not 2048 x 8192
  // (512) but at K below kFp8PingpongBelowK.
  EXPECT_EQ(reduce_scatter_tile_n(false, Element::kFP8E4M3, 512, 4096, 4096, 256, 132), kPingpongTileN);
  EXPECT_EQ(reduce_scatter_tile_n(false, Element::kFP8E4M3, 512, 5120, 5120, 256, 132), kPingpongTileN);
  EXPECT_EQ(reduce_scatter_tile_n(false, Element::kFP8E4M3, 2048, 8192, 8192, 512, 132), 256);
  EXPECT_EQ(reduce_scatter_tile_n(false, Element::kFP8E4M3, 2048, 8192, 5120, 512, 132), kPingpongTileN);
  // Not: a round of 192-wide tiles split three ways goes first (256 x 4096 x 4096), more than a cluster
  // tile a cluster in 16 bits (512 x 5120 x 5120: 80), the epilogue's reduction, and an odd number of
  // tile rows a rank (one-CTA clusters, also 128 wide).
  EXPECT_EQ(reduce_scatter_tile_n(false, Element::kBF16, 256, 4096, 4096, 256, 132), 192);
  EXPECT_EQ(reduce_scatter_tile_n(false, Element::kBF16, 512, 5120, 5120, 256, 132), 192);
  EXPECT_EQ(reduce_scatter_tile_n(true, Element::kBF16, 512, 4096, 4096, 256, 132), 256);
  EXPECT_TRUE(reduce_scatter_one_cta_clusters(kPingpongTileN, 384));
  EXPECT_EQ(algo::fused_rs_tile_n(2, DType::kBF16, 512, 4096, 8192, 132), kPingpongTileN);
  EXPECT_EQ(algo::fused_rs_tile_n(4, DType::kBF16, 1024, 4096, 2048, 132), 256);  // 128 tiles: 2 a cluster
}

TEST(FusedPlan, ReduceScatterStagedLayoutAndCounts) {
  using kernels::fused::StagedLayout;
  // A rank's 2048 rows of 3584 columns (4096x3584x8192 on two ranks) in chunks of 512 rows: 4 x 14
  // tiles each (56: what the kernel's counter of such a chunk reached on one H200).
  kernels::fused::ReduceScatterTiles rs;
  rs.rows_per_rank = 2048, rs.rows_per_chunk = 512, rs.tiles_n = 14;
  EXPECT_EQ(rs.tiles_in_chunk(0), 56u);
  EXPECT_EQ(rs.tiles_in_chunk(3), 56u);
  // Through the epilogue: row-major like the product, and a tile counts once.
  const StagedLayout epilogue(true, 3584);
  EXPECT_EQ(epilogue.tiles_n, 14);
  EXPECT_EQ(epilogue.bytes_before(512), size_t{512} * 3584 * 2);
  EXPECT_EQ(epilogue.count(rs, 0), 56u);
  EXPECT_EQ(epilogue.count(rs, 1), 56u);
  // Through fixup(): a 64 KiB slot per 128 x 256 tile, counted by each of the 8 consumer warps; a
  // partial last tile along N takes a whole slot.
  const StagedLayout fixup(false, 3584);
  EXPECT_EQ(fixup.bytes_before(512), size_t{4} * 14 * 65536);
  EXPECT_EQ(fixup.count(rs, 0), 56u * 8);
  const StagedLayout narrow(false, 1000);
  EXPECT_EQ(narrow.tiles_n, 4);
  EXPECT_EQ(narrow.bytes_before(256), size_t{2} * 4 * 65536);
  EXPECT_EQ(StagedLayout(true, 1000).bytes_before(256), size_t{256} * 1000 * 2);
  // 192-wide tiles through fixup(): 48 KiB slots, 19 along 3584 columns (the last one 128 wide).
  const StagedLayout fixup192(false, 3584, 192);
  EXPECT_EQ(fixup192.tiles_n, 19);
  EXPECT_EQ(fixup192.bytes_before(512), size_t{4} * 19 * 49152);
  // 1280 rows in chunks of 768 (RowChunks(1280, 2)): the last chunk is 512 rows, 4 tile rows.
  rs.rows_per_rank = 1280, rs.rows_per_chunk = 768, rs.tiles_n = 4;
  EXPECT_EQ(rs.rows_in_chunk(1), 512);
  EXPECT_EQ(rs.tiles_in_chunk(0), 6u * 4);
  EXPECT_EQ(rs.tiles_in_chunk(1), 4u * 4);
}

// The staged counters as the kernel indexes them (ReduceScatterTiles::staged_index) and as the op
// and the lab lay them out (StagedCounters): the same slot for every tile's rank and chunk, and the
// done signal's count after them all.
TEST(FusedPlan, ReduceScatterStagedCountersAreIndexedAlikeByTheKernelAndTheHost) {
  using kernels::fused::StagedCounters;
  kernels::fused::ReduceScatterTiles rs;
  rs.rows_per_rank = 1280, rs.rows_per_chunk = 768, rs.tiles_n = 4;
  for (int ranks : {2, 3, 8}) {
    const StagedCounters counters{ranks};
    for (int32_t row0 = 0; row0 < ranks * rs.rows_per_rank; row0 += 128) {
      const int32_t index = rs.staged_index(row0);
      EXPECT_EQ(index, StagedCounters::of(rs.owner_of(row0), rs.chunk_of(row0))) << "row " << row0;
      EXPECT_LT(index, counters.finished_warps());
    }
    EXPECT_EQ(counters.words(), counters.finished_warps() + 1);
  }
}

}  // namespace
}  // namespace asynctp
