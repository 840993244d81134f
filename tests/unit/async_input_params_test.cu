// The fused kernel's scheduler as the host sets it up (kernels/fused/async_input_params.h): how the
// last round's split along K and the grid follow from the problem, the GPU and the workspace. Host
// code, built by nvcc for the CUTLASS types it uses; no GPU needed.
#include <gtest/gtest.h>

#include "kernels/fused/async_input_params.h"

namespace asynctp::kernels::fused {
namespace {

using Tile = cute::Shape<cute::_128, cute::_256, cute::_64>;
using Cluster = cute::Shape<cute::_2, cute::_1, cute::_1>;

// 132 SMs (H100 SXM, H200): 66 co-resident clusters of two CTAs.
cutlass::KernelHardwareInfo h100() {
  cutlass::KernelHardwareInfo hw;
  hw.sm_count = 132;
  hw.max_active_clusters = 66;
  return hw;
}

AsyncInputParams params_for(int M, int N, int K, void* workspace, int workspace_sms = 132) {
  AsyncInputArguments args;
  args.workspace = workspace;
  args.workspace_sms = workspace_sms;
  return async_input_params<Tile, Cluster>(cute::make_shape(M, N, K, 1), h100(), args);
}

char workspace[1];  // only its address is read here

TEST(AsyncInputParams, AProblemOfLessThanOneRoundSplitsOverTheIdleSlots) {
  // 256 x 4096: 16 cluster tiles for 66 slots, all tail; K = 4096 is 64 steps: split 4 ways.
  const AsyncInputParams p = params_for(256, 4096, 4096, workspace);
  EXPECT_EQ(p.total, 16);
  EXPECT_EQ(p.whole, 0);
  EXPECT_EQ(p.tail, 16);
  EXPECT_EQ(p.splits, 4);
  EXPECT_EQ(p.units, 64);
  EXPECT_EQ(async_input_clusters(p, h100()), 64);  // a cluster per unit
}

TEST(AsyncInputParams, ALastRoundAtMostHalfFullIsSplitAndTheGridFillsTheSlots) {
  // 4096 x 6656: 16 x 26 = 416 cluster tiles, 6 rounds and 20 tiles; K = 16384 is 256 steps: 3 ways
  // (1/3 + 2 x 12/256 of a round: shorter than 2 ways' or 4's, which 66 slots do not hold).
  AsyncInputParams p = params_for(4096, 6656, 16384, workspace);
  EXPECT_EQ(p.whole, 396);
  EXPECT_EQ(p.tail, 20);
  EXPECT_EQ(p.splits, 3);
  EXPECT_EQ(p.units, 456);
  EXPECT_EQ(async_input_clusters(p, h100()), 66);
  // K = 1024, 16 steps: after full rounds a split would cost more than it saves (tail_split.h).
  p = params_for(4096, 6656, 1024, workspace);
  EXPECT_EQ(p.splits, 1);
  EXPECT_EQ(p.units, 416);
}

TEST(AsyncInputParams, NothingIsSplitWithoutRoomOrWhereTheRoundIsFull) {
  // 512 x 8448: 2 x 33 = 66 cluster tiles, one full round.
  AsyncInputParams p = params_for(512, 8448, 512, workspace);
  EXPECT_EQ(p.splits, 1);
  EXPECT_EQ(p.units, 66);
  // No workspace (a first call under capture): every tile whole, a cluster per tile.
  p = params_for(256, 4096, 4096, nullptr);
  EXPECT_EQ(p.splits, 1);
  EXPECT_EQ(p.units, 16);
  EXPECT_EQ(async_input_clusters(p, h100()), 16);
  // A workspace sized for fewer SMs than the split needs (16 tiles x 2 CTAs).
  p = params_for(256, 4096, 4096, workspace, 16);
  EXPECT_EQ(p.splits, 1);
  EXPECT_EQ(async_input_clusters(p, h100()), 16);
}

}  // namespace
}  // namespace asynctp::kernels::fused
