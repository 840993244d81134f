// The fused algorithm's host-side choices: the tile width per shape and the pieces per rank.
#include <gtest/gtest.h>

#include "algo/fused.h"
#include "kernels/fused/ag_gemm.h"

namespace asynctp {
namespace {

TEST(FusedPlan, TileWidthFillsTheLastRoundOfTiles) {
  using kernels::fused::pick_tile_n;
  // 132 SMs (H100 SXM, H200). At 4096 x 3584, 256-wide tiles make 448 tiles: 3.4 rounds, so 4; 192-wide
  // make 608: 4.6 rounds, so 5, each 3/4 as long (960 against 1024).
  EXPECT_EQ(pick_tile_n(4096, 3584, 132), 192);
  // 7 rounds of 256 (832 tiles: 6.3 rounds) against 9 of 192: 3.6% less, under the 5% margin (192
  // measured slower there); 2 rounds against 3; 32 against 42 (1.6% less): the wide tile stays.
  EXPECT_EQ(pick_tile_n(4096, 6656, 132), 256);
  EXPECT_EQ(pick_tile_n(2048, 3584, 132), 256);
  EXPECT_EQ(pick_tile_n(16384, 8192, 132), 256);
}

TEST(FusedPlan, PiecesPerRank) {
  EXPECT_EQ(algo::resolve_fused_pieces(0, 2048), algo::kFusedDefaultPieces);
  EXPECT_EQ(algo::resolve_fused_pieces(3, 2048), 3);
  EXPECT_EQ(algo::resolve_fused_pieces(16, 5), 5);  // never more pieces than rows
  EXPECT_EQ(algo::resolve_fused_pieces(0, 1), 1);
}

}  // namespace
}  // namespace asynctp
