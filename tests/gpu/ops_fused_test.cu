// The fused algorithm (all_gather_matmul) against the reference: every option combination on 1 and 2
// ranks, shard rows that do and do not line up with the kernel's 128-row tiles and 256-row clusters,
// every number of pieces, calls back to back and mixed with the pipelined reduce-scatter (one epoch
// and flag protocol for both), CUDA graph replays with changing inputs, and a peer that never comes
// (the GEMM's own wait times out).
#include "comm/communicator_impl.h"
#include "ops_problems.h"

namespace asynctp {
namespace {

using namespace testing;

OpOptions with(Algorithm algorithm, int chunks = 0) {
  OpOptions o;
  o.algorithm = algorithm;
  o.chunks_per_rank = chunks;
  return o;
}

int every_combination(RankContext& ctx) {
  auto comm = make_comm(ctx);
  Stream st;
  reference::Fp32Gemm fp32;
  // gather_dim last runs the pipelined algorithm (documented), and is checked through the same API.
  const int n = run_every_ag_combination(*comm, st.s, fp32, with(Algorithm::kFused));
  std::printf("rank %d: fused: %d cases correct\n", ctx.rank, n);
  return 0;
}

TEST(FusedOps, EveryCombination_1Rank) {
  REQUIRE_GPUS(1);
  RUN_RANKS(1, every_combination);
}

TEST(FusedOps, EveryCombination_2Ranks) {
  REQUIRE_GPUS(2);
  RUN_RANKS(2, every_combination);
}

// Shards whose edges fall inside a tile (the tile then waits for two ranks' rows and reads this rank's
// from the gathered buffer), shards smaller than one tile, and pieces from 1 to the most allowed.
int tiles_across_shard_edges(RankContext& ctx) {
  auto comm = make_comm(ctx);
  Stream st;
  reference::Fp32Gemm fp32;
  const int ws = ctx.world_size;
  int n = 0;
  for (int64_t rows : {1, 8, 127, 128, 130, 256, 300, 1000, 1088})
    for (int chunks : {1, 2, 3, kMaxChunksPerRank}) {
      const bool col = (rows + chunks) % 2 == 0;
      const DType dt = chunks == 3 ? DType::kFP16 : DType::kBF16;
      run_ag_case(*comm, AgCase{{rows * ws, 264}, 520, false, col, chunks == 2, 1, dt}, st.s, fp32,
                  with(Algorithm::kFused, chunks));
      ++n;
    }
  std::printf("rank %d: %d shard shapes correct\n", ctx.rank, n);
  return 0;
}

TEST(FusedOps, TilesAcrossShardEdgesAndEveryPieceCount_1Rank) {
  REQUIRE_GPUS(1);
  RUN_RANKS(1, tiles_across_shard_edges);
}

TEST(FusedOps, TilesAcrossShardEdgesAndEveryPieceCount_2Ranks) {
  REQUIRE_GPUS(2);
  RUN_RANKS(2, tiles_across_shard_edges);
}

// A larger problem: many tiles per CTA, so the persistent loop, the tile order and the waits between
// tiles all run; B in both layouts, two Bs.
TEST(FusedOps, ManyTilesPerCta_2Ranks) {
  REQUIRE_GPUS(2);
  RUN_RANKS(2, [](RankContext& ctx) {
    auto comm = make_comm(ctx);
    Stream st;
    reference::Fp32Gemm fp32;
    for (bool col : {false, true}) {
      run_ag_case(*comm, AgCase{{4096, 1024}, 2048, false, col, true, 2, DType::kBF16}, st.s, fp32,
                  with(Algorithm::kFused));
    }
    return 0;
  });
}

TEST(FusedOps, CallsBackToBackMixedWithPipelined) {
  REQUIRE_GPUS(2);
  RUN_RANKS(2, [](RankContext& ctx) {
    return calls_back_to_back(ctx, with(Algorithm::kFused, 3), with(Algorithm::kPipelined));
  });
}

TEST(FusedOps, CapturedGraphReplays1000TimesWithChangingInputs) {
  REQUIRE_GPUS(2);
  RUN_RANKS(2, [](RankContext& ctx) {
    return graph_replays(ctx, with(Algorithm::kFused), with(Algorithm::kPipelined), 1000);
  });
}

TEST(FusedOps, APeerThatNeverComesEndsWithTheTimeoutReport) {
  REQUIRE_GPUS(2);
  RUN_RANKS(2, [](RankContext& ctx) { return absent_peer_times_out(ctx, with(Algorithm::kFused)); });
}

}  // namespace
}  // namespace asynctp
