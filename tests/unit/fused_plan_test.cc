// The fused algorithm's host-side choices: the pieces per rank.
#include <gtest/gtest.h>

#include "algo/fused.h"

namespace asynctp {
namespace {

TEST(FusedPlan, PiecesPerRank) {
  EXPECT_EQ(algo::resolve_fused_pieces(0, 2048), algo::kFusedDefaultPieces);
  EXPECT_EQ(algo::resolve_fused_pieces(3, 2048), 3);
  EXPECT_EQ(algo::resolve_fused_pieces(16, 5), 5);  // never more pieces than rows
  EXPECT_EQ(algo::resolve_fused_pieces(0, 1), 1);
}

}  // namespace
}  // namespace asynctp
