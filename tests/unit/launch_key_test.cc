// The fused GEMM's kept launches are found by comparing the arguments byte for byte: every field tells
// launches apart, except rs.begin_epoch, which each launch writes in.
#include <gtest/gtest.h>

#include <cstddef>

#include "kernels/fused/launch_key.h"

namespace asynctp::kernels::fused {
namespace {

TEST(LaunchKey, EveryByteOfTheArgumentsTellsLaunchesApart) {
  const FusedGemmArgs base;
  const size_t epoch_at = offsetof(FusedGemmArgs, rs) + offsetof(ReduceScatterTiles, begin_epoch);
  for (size_t i = 0; i < sizeof(FusedGemmArgs); ++i) {
    FusedGemmArgs other = base;
    reinterpret_cast<unsigned char*>(&other)[i] ^= 0x5a;
    const bool in_epoch = i >= epoch_at && i < epoch_at + sizeof(uint32_t);
    EXPECT_EQ(same_launch(base, other), in_epoch) << "byte " << i;
  }
}

TEST(LaunchKey, TheCallsEpochIsNotPartOfIt) {
  FusedGemmArgs a, b;
  a.M = b.M = 4096;
  a.rs.begin_epoch = 7;
  b.rs.begin_epoch = 8;
  EXPECT_TRUE(same_launch(a, b));
  b.rs.push_pad_index = 1;
  EXPECT_FALSE(same_launch(a, b));
}

}  // namespace
}  // namespace asynctp::kernels::fused
