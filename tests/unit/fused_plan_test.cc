// The fused algorithm's host-side choices: the tile width per shape and the pieces per rank.
#include <gtest/gtest.h>

#include "algo/fused.h"
#include "kernels/fused/ag_gemm.h"

namespace asynctp {
namespace {

using kernels::fused::pick_tile_n;

TEST(FusedPlan, TileWidthFillsTheLastRoundOfTiles) {
  // 132 SMs (H100 SXM, H200). N = 3584 is 14 tiles of 256 (448 tiles at M = 4096: 3.4 rounds) or 16
  // of 224 (512 tiles: 3.9 rounds, each tile 1/8 cheaper).
  EXPECT_EQ(pick_tile_n(4096, 3584, 132), 224);
  EXPECT_EQ(pick_tile_n(2048, 3584, 132), 224);
  // Equal rounds-times-width: the wider tile stays.
  EXPECT_EQ(pick_tile_n(4096, 6656, 132), 256);
  // 36 rounds of 224 are under 5% cheaper than 32 of 256: not worth a partial last column of tiles.
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
