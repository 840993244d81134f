// The fused algorithm against the reference. all_gather_matmul: every option combination on 1 rank and
// at every multi-rank world size, shard rows that do and do not line up with the kernel's 128-row tiles
// and 256-row clusters, every number of chunks, calls back to back and mixed with the pipelined
// reduce-scatter (one epoch and flag protocol for both), CUDA graph replays with changing inputs, and a
// peer that never comes (the GEMM's own wait times out). matmul_reduce_scatter: its options and the
// cases it hands to pipelined (on two ranks reduced both in the epilogue and in fixup()), more layouts
// than the pushes' kept graphs, the same bits on every call, the tile trace, and both fused ops back to
// back and in a graph.
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "algo/fused.h"
#include "algo/overlap_resources.h"
#include "algo/resources.h"
#include "comm/communicator_impl.h"
#include "kernels/fused/fused_gemm.h"
#include "kernels/fused/tail_split.h"
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

TEST(FusedOps, EveryCombination_MultiRank) {
  RUN_EVERY_WORLD_SIZE(every_combination);
}

// The fused kernel's measurement knobs (docs/reference/environment.md) change how it walks and cuts
// its tiles, never the result: every setting, set before the ranks start (the kernel reads it at each
// call, so in-process ranks, threads of this process, see each setting too), on shapes that have
// partial tiles, several chunks, and a last round that splits.
int fused_results_under_the_knobs(RankContext& ctx) {
  auto comm = make_comm(ctx);
  Stream st;
  reference::Fp32Gemm fp32;
  const int ws = ctx.world_size;
  for (int chunks : {1, 3}) {
    run_ag_case(*comm, AgCase{{1000 * ws, 520}, 776, false, false, false, 1, DType::kBF16}, st.s, fp32,
                with(Algorithm::kFused, chunks));
    run_ag_case(*comm, AgCase{{512 * ws, 4096}, 1032, false, true, true, 1, DType::kFP16}, st.s, fp32,
                with(Algorithm::kFused, chunks));
  }
  run_rs_case(*comm, RsCase{512 * ws, 776, 264 * ws, false, false, ReduceOp::kSum, DType::kBF16, false}, st.s, fp32,
              with(Algorithm::kFused, 2));
  return 0;
}

TEST(FusedOps, EveryMeasurementKnobKeepsTheResultsRight) {
  for (const auto& [name, value] : std::vector<std::pair<const char*, const char*>>{
           {"ASYNCTP_FUSED_TILE_N", "128"}, {"ASYNCTP_FUSED_TILE_N", "192"}, {"ASYNCTP_FUSED_TILE_N", "256"},
           {"ASYNCTP_FUSED_TILE_N", "320"},
           {"ASYNCTP_FUSED_BAND_M", "1"},
           {"ASYNCTP_FUSED_BAND_M", "3"}, {"ASYNCTP_FUSED_MAX_SPLITS", "1"}, {"ASYNCTP_FUSED_MAX_SPLITS", "2"}}) {
    SCOPED_TRACE(detail::cat(name, "=", value));
    ScopedEnv knob(name, value);
    RUN_EVERY_WORLD_SIZE(fused_results_under_the_knobs);
  }
}

// Shards whose edges fall inside a tile (the tile then waits for two ranks' rows and reads this rank's
// from the gathered buffer), shards smaller than one tile, and chunks from 1 to the most allowed.
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

TEST(FusedOps, TilesAcrossShardEdgesAndEveryChunkCount_1Rank) {
  REQUIRE_GPUS(1);
  RUN_RANKS(1, tiles_across_shard_edges);
}

TEST(FusedOps, TilesAcrossShardEdgesAndEveryChunkCount_MultiRank) {
  RUN_EVERY_WORLD_SIZE(tiles_across_shard_edges);
}

// Less than a round of 192-wide tiles split four ways along K (split_192_takes) at the SMs this rank
// may fill: about 256 rows in all, 3 tiles across N, K of 64 steps; B in both layouts. At one and two
// ranks each rank's rows are whole tiles and the kernel takes these tiles; at three and four they
// straddle tiles, and it takes the ping-pong schedule instead (tile_n_for), which is checked alike.
int split_192_gathers(RankContext& ctx) {
  auto comm = make_comm(ctx);
  Stream st;
  reference::Fp32Gemm fp32;
  const int ws = ctx.world_size;
  const int64_t rows = 256 / ws, M = rows * ws, N = 576, K = 4096;
  const int sms = impl_of(*comm).sm_budget;
  RANK_CHECK(kernels::fused::split_192_takes(M, N, K, sms, kernels::fused::kMaxTailSplits), M, "x", N, "x", K,
             " on ", sms, " SMs: not 192-wide split tiles");
  for (bool col : {false, true}) {
    run_ag_case(*comm, AgCase{{M, K}, N, false, col, col, 1, col ? DType::kFP16 : DType::kBF16}, st.s, fp32,
                with(Algorithm::kFused));
  }
  return 0;
}

TEST(FusedOps, Split192WideTilesGatherEveryRanksRows_1Rank) {
  REQUIRE_GPUS(1);
  RUN_RANKS(1, split_192_gathers);
}

TEST(FusedOps, Split192WideTilesGatherEveryRanksRows_MultiRank) { RUN_EVERY_WORLD_SIZE(split_192_gathers); }

// The widest tiles (kWideTileN) in both ops at one rank, the only world size they are taken at
// (pick_tile_n): for each op the first of a few shapes whose kernel takes them on this GPU's SMs,
// run in both B layouts and 16-bit types, with one chunk and with three. (At two to four ranks the
// all-gather runs them under ASYNCTP_FUSED_TILE_N=320: EveryMeasurementKnobKeepsTheResultsRight.)
int wide_tiles_in_both_ops(RankContext& ctx) {
  auto comm = make_comm(ctx);
  Stream st;
  reference::Fp32Gemm fp32;
  const int ws = ctx.world_size;
  const int sms = impl_of(*comm).sm_budget;
  int64_t ag_m = 0, ag_n = 0, ag_k = 0, rs_m = 0, rs_n = 0, rs_k = 0;
  for (int64_t cluster_rows = 1; cluster_rows <= 8; ++cluster_rows)
    for (int64_t n = 576; n <= 6336; n += kernels::fused::kWideTileN)
      for (int64_t k : {256, 512, 1024}) {
        const int64_t m = kernels::fused::kClusterRows * cluster_rows * ws;
        if (ag_m == 0 && kernels::fused::tile_n_above_one_row(m, n, k, sms, Element::kBF16, kernels::fused::kMaxTailSplits,
                                                              true, true) == kernels::fused::kWideTileN) {
          ag_m = m, ag_n = n, ag_k = k;
        }
        if (rs_m == 0 && algo::fused_rs_tile_n(ws, DType::kBF16, m, n, k, sms) == kernels::fused::kWideTileN) {
          rs_m = m, rs_n = n, rs_k = k * ws;
        }
      }
  RANK_CHECK(ag_m != 0 && rs_m != 0, "no shape took the widest tiles on ", sms, " SMs: all-gather ", ag_m,
             " rows, reduce-scatter ", rs_m);
  for (bool col : {false, true})
    for (int chunks : {1, 3}) {
      const DType dt = col ? DType::kFP16 : DType::kBF16;
      run_ag_case(*comm, AgCase{{ag_m, ag_k}, ag_n, false, col, chunks == 3, 1, dt}, st.s, fp32,
                  with(Algorithm::kFused, chunks));
      run_rs_case(*comm, RsCase{rs_m, rs_n, rs_k, false, col, ReduceOp::kSum, dt, false}, st.s, fp32,
                  with(Algorithm::kFused, chunks));
    }
  std::printf("rank %d: 320-wide tiles: all-gather %ldx%ldx%ld, reduce-scatter %ldx%ldx%ld\n", ctx.rank,
              static_cast<long>(ag_m), static_cast<long>(ag_n), static_cast<long>(ag_k), static_cast<long>(rs_m),
              static_cast<long>(rs_n), static_cast<long>(rs_k));
  return 0;
}

TEST(FusedOps, WideTilesInBothOps_1Rank) {
  REQUIRE_GPUS(1);
  RUN_RANKS(1, wide_tiles_in_both_ops);
}

// A larger problem: many tiles per CTA, so the persistent loop, the tile order and the waits between
// tiles all run; B in both layouts, two Bs.
TEST(FusedOps, ManyTilesPerCta_MultiRank) {
  RUN_EVERY_WORLD_SIZE([](RankContext& ctx) {
    auto comm = make_comm(ctx);
    Stream st;
    reference::Fp32Gemm fp32;
    for (bool col : {false, true}) {
      run_ag_case(*comm, AgCase{{2048 * ctx.world_size, 1024}, 2048, false, col, true, 2, DType::kBF16}, st.s, fp32,
                  with(Algorithm::kFused));
    }
    return 0;
  });
}

TEST(FusedOps, CallsBackToBackMixedWithPipelined) {
  RUN_EVERY_WORLD_SIZE([](RankContext& ctx) {
    return calls_back_to_back(ctx, with(Algorithm::kFused, 3), with(Algorithm::kPipelined));
  });
}

TEST(FusedOps, CapturedGraphReplays1000TimesWithChangingInputs) {
  RUN_EVERY_WORLD_SIZE([](RankContext& ctx) {
    return graph_replays(ctx, with(Algorithm::kFused), with(Algorithm::kPipelined), 1000);
  });
}

// matmul_reduce_scatter: every option with rows per rank that the kernel takes (multiples of 128, up
// to more tiles than one round holds, N not a multiple of the tile, K of one step, tiles 128, 192 and
// 256 wide), and the cases that run pipelined instead (odd rows, scatter_dim last), every chunk count.
int reduce_scatter_cases_on(RankContext& ctx, Communicator& comm) {
  Stream st;
  reference::Fp32Gemm fp32;
  const int ws = ctx.world_size;
  int n = 0;
  std::set<int> widths;  // of the tiles the reduction ran on, where there was one
  for (int64_t rows : {256, 512, 2048})
    for (bool col : {false, true})
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg})
        for (DType dt : {DType::kBF16, DType::kFP16}) {
          const int64_t N = rows == 2048 ? 1000 : 384, K = rows == 256 ? 64 * ws : 520 * ws;
          run_rs_case(comm, RsCase{rows * ws, N, K, false, col, op, dt, rows == 512}, st.s, fp32, with(Algorithm::kFused));
          if (ws > 1) widths.insert(algo::fused_rs_tile_n(ws, dt, rows * ws, N, K / ws, impl_of(comm).sm_budget));
          ++n;
        }
  // 384 columns are two tiles either way, and 192-wide ones leave no part of a tile idle; at 4096 rows a
  // rank the 128-wide ones make more cluster tiles than the ping-pong schedule takes (at 256 and 512
  // rows it takes them: reduce_scatter_pingpong, below).
  run_rs_case(comm, RsCase{4096 * ws, 384, 64 * ws, false, false, ReduceOp::kSum, DType::kBF16, false}, st.s, fp32,
              with(Algorithm::kFused));
  if (ws > 1) widths.insert(algo::fused_rs_tile_n(ws, DType::kBF16, 4096 * ws, 384, 64, impl_of(comm).sm_budget));
  ++n;
  const char* forced = std::getenv("ASYNCTP_FUSED_RS_REDUCE");
  const bool forced_epilogue = forced != nullptr && std::string(forced) == "epilogue";
  RANK_CHECK(ws == 1 || widths.count(192) == 1 || forced_epilogue, "no case ran the reduce-scatter's 192-wide tiles");
  // An odd number of 128-row tiles a rank: one-CTA clusters of 128 x 128 tiles, reduced in fixup(), so
  // not where the epilogue is forced. Each must run the fused kernel, not pipelined (3 tiles along N,
  // the last one partial, within two rounds on every world size's SMs).
  const auto fused_calls = [&comm] {
    const algo::OverlapResources* pr = algo::Resources::of(comm).overlap.get();
    return pr == nullptr ? uint64_t{0} : pr->fused_reductions(false) + pr->fused_reductions(true);
  };
  for (int64_t rows : {128, 384}) {
    if (forced_epilogue) break;
    for (bool col : {false, true})
      for (DType dt : {DType::kBF16, DType::kFP16}) {
        const uint64_t before = fused_calls();
        run_rs_case(comm, RsCase{rows * ws, 264, 136 * ws, false, col, ReduceOp::kSum, dt, rows == 384}, st.s, fp32,
                    with(Algorithm::kFused));
        if (ws > 1) {
          RANK_CHECK(algo::fused_rs_tile_n(ws, dt, rows * ws, 264, 136, impl_of(comm).sm_budget) ==
                         kernels::fused::kOneRowTileN, rows, " rows a rank: not the one-CTA clusters' tiles");
          RANK_CHECK(fused_calls() == before + 1, rows, " rows a rank ran pipelined, not fused");
        }
        ++n;
      }
  }
  for (int chunks : {1, 2, 3, kMaxChunksPerRank}) {
    run_rs_case(comm, RsCase{1024 * ws, 264, 136 * ws, false, chunks % 2 == 0, ReduceOp::kSum, DType::kBF16, false},
                st.s, fp32, with(Algorithm::kFused, chunks));
    // 5 cluster rows per rank in chunks of 3 and 2: bands of one cluster row (reduce_scatter_band_m).
    run_rs_case(comm, RsCase{1280 * ws, 520, 64 * ws, false, true, ReduceOp::kAvg, DType::kFP16, false}, st.s, fp32,
                with(Algorithm::kFused, chunks));
    n += 2;
  }
  // One chunk of 4096 rows by 8 tiles: each cluster stages about two tiles of a chunk, so their counts
  // go up in one release (docs/design/fused_matmul_reduce_scatter.md, "one release per chunk").
  run_rs_case(comm, RsCase{4096 * ws, 2048, 64 * ws, false, false, ReduceOp::kSum, DType::kBF16, false}, st.s, fp32,
              with(Algorithm::kFused, 1));
  ++n;
  for (bool last : {false, true}) {  // pipelined underneath
    run_rs_case(comm, RsCase{130 * ws, 264, 72 * ws, last, false, ReduceOp::kSum, DType::kBF16, false}, st.s, fp32,
                with(Algorithm::kFused));
    run_rs_case(comm, RsCase{256 * ws, 384, 128 * ws, last, true, ReduceOp::kAvg, DType::kFP16, false}, st.s, fp32,
                with(Algorithm::kFused));
    n += 2;
  }
  std::printf("rank %d: %d reduce-scatter cases correct\n", ctx.rank, n);
  return 0;
}

int reduce_scatter_cases(RankContext& ctx) {
  auto comm = make_comm(ctx);
  return reduce_scatter_cases_on(ctx, *comm);
}

TEST(FusedOps, ReduceScatterCases_1Rank) {
  REQUIRE_GPUS(1);
  RUN_RANKS(1, reduce_scatter_cases);
}

TEST(FusedOps, ReduceScatterCases_MultiRank) {
  RUN_EVERY_WORLD_SIZE(reduce_scatter_cases);
}

// A reduce-scatter of at most one 2 x 1 cluster tile 128 wide a cluster, at an even number of tile rows
// a rank, runs the ping-pong schedule and reduces in its epilogue (pingpong_epilogue.cuh): 256 and 512
// rows a rank, N as wide as this rank's SMs allow and not a multiple of 128, K of one step and of many,
// B in both layouts, bf16 and fp16, sum and average, one chunk a rank and two.
int reduce_scatter_pingpong(RankContext& ctx) {
  auto comm = make_comm(ctx);
  Stream st;
  reference::Fp32Gemm fp32;
  const int ws = ctx.world_size;
  const int sms = impl_of(*comm).sm_budget;
  const int64_t clusters = std::max(1, sms / 2);
  int n = 0;
  for (int64_t rows : {256, 512}) {
    const int64_t M = rows * ws, cluster_rows = M / kernels::fused::kClusterRows;
    const int64_t N = std::min<int64_t>(1000, clusters / cluster_rows * 128 - 24);
    if (N < 104) continue;  // more cluster rows than clusters: never the ping-pong schedule
    for (bool col : {false, true})
      for (DType dt : {DType::kBF16, DType::kFP16}) {
        const int64_t K = (col ? 64 : 1096) * ws;
        RANK_CHECK(ws == 1 || algo::fused_rs_tile_n(ws, dt, M, N, K / ws, sms) == kernels::fused::kPingpongTileN,
                   M, "x", N, "x", K, " on ", ws, " ranks of ", sms, " SMs: not the ping-pong schedule");
        const ReduceOp op = dt == DType::kFP16 ? ReduceOp::kAvg : ReduceOp::kSum;
        run_rs_case(*comm, RsCase{M, N, K, false, col, op, dt, false}, st.s, fp32, with(Algorithm::kFused, rows / 256));
        ++n;
      }
  }
  RANK_CHECK(n >= 4, "only ", n, " ping-pong cases fit ", sms, " SMs");
  std::printf("rank %d: %d ping-pong reduce-scatter cases correct\n", ctx.rank, n);
  return 0;
}

TEST(FusedOps, ReduceScatterPingpong_1Rank) {
  REQUIRE_GPUS(1);
  RUN_RANKS(1, reduce_scatter_pingpong);
}

TEST(FusedOps, ReduceScatterPingpong_MultiRank) { RUN_EVERY_WORLD_SIZE(reduce_scatter_pingpong); }

// The reduce-scatter's two ways of reducing (reduce_scatter_tiles.h) on the same cases, whichever the
// shape would get: ASYNCTP_FUSED_RS_REDUCE, which each rank reads as it starts (the ranks are forked
// after it is set).
struct ForcedReduction : ScopedEnv {
  explicit ForcedReduction(const char* how) : ScopedEnv("ASYNCTP_FUSED_RS_REDUCE", how) {}
};

// reduce_scatter_cases, then a check that every fused call on more than one rank reduced the way
// ASYNCTP_FUSED_RS_REDUCE (set by ForcedReduction before the ranks are forked) says.
int reduce_scatter_cases_reduced(RankContext& ctx, bool in_epilogue) {
  auto comm = make_comm(ctx);
  if (const int failed = reduce_scatter_cases_on(ctx, *comm)) return failed;
  if (ctx.world_size == 1) return 0;
  const algo::OverlapResources& pr = *algo::Resources::of(*comm).overlap;
  RANK_CHECK(pr.fused_reductions(in_epilogue) > 0 && pr.fused_reductions(!in_epilogue) == 0,
             "fused reductions in the epilogue ", pr.fused_reductions(true), ", in fixup() ",
             pr.fused_reductions(false), "; all were to be ", in_epilogue ? "in the epilogue" : "in fixup()");
  return 0;
}

TEST(FusedOps, ReduceScatterCasesReducedInTheEpilogue_2Ranks) {
  REQUIRE_GPUS(2);
  ForcedReduction forced("epilogue");
  RUN_RANKS(2, [](RankContext& ctx) { return reduce_scatter_cases_reduced(ctx, /*in_epilogue=*/true); });
}

TEST(FusedOps, ReduceScatterCasesReducedInFixup_MultiRank) {
  ForcedReduction forced("fixup");
  RUN_EVERY_WORLD_SIZE([](RankContext& ctx) { return reduce_scatter_cases_reduced(ctx, /*in_epilogue=*/false); });
}

// The epilogue's way under capture: its staged tiles' counts (one per tile, not per warp) and the
// epilogue's source loads from the inbox, with the epoch from the device. Replays with changing inputs
// would read a stale inbox or hang on a count left over.
TEST(FusedOps, CapturedGraphReplaysReducingInTheEpilogue_2Ranks) {
  REQUIRE_GPUS(2);
  ForcedReduction forced("epilogue");
  RUN_RANKS(2, [](RankContext& ctx) {
    return graph_replays(ctx, with(Algorithm::kFused), with(Algorithm::kFused, 2), 200);
  });
}

// The epilogue's way pushed from the kernel (ASYNCTP_FUSED_RS_PUSH=kernel; reduce_scatter_tiles.h,
// push_inbox): the staged tiles stored by TMA into the peer's inbox and counted in its pad, the counts
// zeroed by the kernel before it says done. Set, like ForcedReduction, before the ranks are forked.
struct ForcedPushFromKernel : ScopedEnv {
  ForcedPushFromKernel() : ScopedEnv("ASYNCTP_FUSED_RS_PUSH", "kernel") {}
};

// Every fused call on two ranks pushed from the kernel (all reduce in the epilogue).
int check_pushed_from_kernel(Communicator& comm) {
  const algo::OverlapResources& pr = *algo::Resources::of(comm).overlap;
  RANK_CHECK(pr.kernel_pushes() > 0 && pr.kernel_pushes() == pr.fused_reductions(true), "fused calls pushed from the kernel ",
             pr.kernel_pushes(), " of ", pr.fused_reductions(true), " reduced in the epilogue; all were to be");
  return 0;
}

// The fused reduce-scatter's way of reducing and its tiles' width follow the kernel's SMs, and the
// ranks stage for each other in that layout: ranks whose sm_budget differs are refused together,
// with nothing written.
TEST(FusedOps, ReduceScatterSmBudgetsThatDifferFailOnEveryRank_MultiRank) {
  RUN_EVERY_WORLD_SIZE([](RankContext& ctx) {
    if (ctx.world_size == 1) return 0;
    CommunicatorOptions o;
    o.sm_budget = ctx.rank == 0 ? 32 : 64;
    auto comm = Communicator::create(ctx, o);
    Stream st;
    const int64_t rows = 256, N = 384, K = 64 * ctx.world_size;
    Buf a(rows * ctx.world_size * K * 2), b(K * N * 2), out(rows * N * 2);
    RANK_CUDA(cudaMemsetAsync(a.p, 0, rows * ctx.world_size * K * 2, st.s));
    RANK_CUDA(cudaMemsetAsync(b.p, 0, K * N * 2, st.s));
    RANK_CUDA(cudaMemsetAsync(out.p, 0x5A, rows * N * 2, st.s));
    std::string message;
    try {
      matmul_reduce_scatter(*comm, TensorRef::dense(a.p, DType::kBF16, {rows * ctx.world_size, K}),
                            TensorRef::dense(b.p, DType::kBF16, {K, N}), 0, ReduceOp::kSum,
                            TensorRef::dense(out.p, DType::kBF16, {rows, N}), st.s, with(Algorithm::kFused));
    } catch (const Error& e) {
      message = e.what();
    }
    RANK_CHECK(contains(message, "ranks disagree on the fused kernel's SMs (CommunicatorOptions::sm_budget)"),
               "got: ", message);
    std::vector<unsigned char> host(rows * N * 2);
    RANK_CUDA(cudaMemcpyAsync(host.data(), out.p, host.size(), cudaMemcpyDeviceToHost, st.s));
    comm->synchronize(st.s);
    for (unsigned char v : host) RANK_CHECK(v == 0x5A, "the output was written to");
    return 0;
  });
}

TEST(FusedOps, ReduceScatterCasesPushedFromTheKernel_2Ranks) {
  REQUIRE_GPUS(2);
  ForcedReduction forced("epilogue");
  ForcedPushFromKernel push;
  RUN_RANKS(2, [](RankContext& ctx) {
    auto comm = make_comm(ctx);
    if (const int failed = reduce_scatter_cases_on(ctx, *comm)) return failed;
    return check_pushed_from_kernel(*comm);
  });
}

// Under capture the epoch comes from the device and the epoch kernel runs first; replays with changing
// inputs would read a stale inbox, or hang on a count left over, if the kernel did not zero its counts.
TEST(FusedOps, CapturedGraphReplaysPushedFromTheKernel_2Ranks) {
  REQUIRE_GPUS(2);
  ForcedReduction forced("epilogue");
  ForcedPushFromKernel push;
  RUN_RANKS(2, [](RankContext& ctx) {
    return graph_replays(ctx, with(Algorithm::kFused), with(Algorithm::kFused, 2), 200);
  });
}

// By default a small problem reduces in fixup() and a large one in the epilogue, which stage different
// layouts and count differently (reduce_scatter_tiles.h): the two in turn on one communicator each find
// the counts, the staging buffer and the peer's inbox as they need them; so do the copy engine's arrived
// flags and the kernel's pushed counts, where the epilogue's way pushes from the kernel.
int both_ways_in_turn(RankContext& ctx, bool pushed_from_kernel) {
  auto comm = make_comm(ctx);
  Stream st;
  reference::Fp32Gemm fp32;
  for (int i = 0; i < 3; ++i) {
    run_rs_case(*comm, RsCase{1024, 768, 512, false, false, ReduceOp::kSum, DType::kBF16, false}, st.s, fp32,
                with(Algorithm::kFused));
    // 64 x 12 = 768 tiles of 128 x 256: at least five rounds on 132 SMs, so the epilogue's way.
    run_rs_case(*comm, RsCase{8192, 3072, 256, false, false, ReduceOp::kAvg, DType::kFP16, false}, st.s, fp32,
                with(Algorithm::kFused, 3));
  }
  const algo::OverlapResources& pr = *algo::Resources::of(*comm).overlap;
  RANK_CHECK(pr.fused_reductions(true) == 3 && pr.fused_reductions(false) == 3, "fused reductions in the epilogue ",
             pr.fused_reductions(true), ", in fixup() ", pr.fused_reductions(false), "; expected 3 and 3");
  RANK_CHECK(pr.kernel_pushes() == (pushed_from_kernel ? 3u : 0u), "fused calls pushed from the kernel ",
             pr.kernel_pushes(), "; expected ", pushed_from_kernel ? 3 : 0);
  return 0;
}

TEST(FusedOps, ReduceScatterBothWaysInTurn_2Ranks) {
  REQUIRE_GPUS(2);
  RUN_RANKS(2, [](RankContext& ctx) { return both_ways_in_turn(ctx, false); });
}

TEST(FusedOps, ReduceScatterBothWaysInTurnPushedFromTheKernel_2Ranks) {
  REQUIRE_GPUS(2);
  ForcedPushFromKernel push;
  RUN_RANKS(2, [](RankContext& ctx) { return both_ways_in_turn(ctx, true); });
}

// The pushes of each layout are a CUDA graph the communicator keeps (algo/stream_replay.h), at most
// kMaxGraphs of them: more layouts than that, then the first ones again, whose graphs were dropped.
// Ranks that share a GPU enqueue the pushes call by call and keep none.
TEST(FusedOps, ReduceScatterWithMoreLayoutsThanKeptGraphs_MultiRank) {
  RUN_EVERY_WORLD_SIZE([](RankContext& ctx) {
    auto comm = make_comm(ctx);
    Stream st;
    reference::Fp32Gemm fp32;
    const int ws = ctx.world_size;
    const int layouts = static_cast<int>(algo::StreamReplay::kMaxGraphs) + 4;
    for (int i = 0; i < layouts + 6; ++i) {
      const int64_t n = 256 * (i % layouts + 1);  // a width of its own: its own staged layout
      run_rs_case(*comm, RsCase{256 * ws, n, 64 * ws, false, false, ReduceOp::kSum, DType::kBF16, false}, st.s, fp32,
                  with(Algorithm::kFused));
    }
    const algo::OverlapResources& pr = *algo::Resources::of(*comm).overlap;
    const size_t kept = pr.replays().size(), expected = pr.replays_off() ? 0 : algo::StreamReplay::kMaxGraphs;
    RANK_CHECK(kept == expected, "graphs kept: ", kept, ", expected ", expected);
    return 0;
  });
}

// The sum of the partials is added in a fixed order, so the same inputs give the same bits.
TEST(FusedOps, ReduceScatterRepeatsBitForBit_MultiRank) {
  RUN_EVERY_WORLD_SIZE([](RankContext& ctx) {
    auto comm = make_comm(ctx);
    Stream st;
    reference::Fp32Gemm fp32;
    RsProblem p(ctx.world_size, ctx.rank, 1024 * ctx.world_size, 1024, 2048 * ctx.world_size, st.s);
    Buf a(p.M * p.kl * 2), out(p.rows * p.N * 2);
    p.make(3, ctx.rank, a.p, p.ref.f(), fp32, st.s);
    std::vector<unsigned char> first, now(p.rows * p.N * 2);
    for (int i = 0; i < 5; ++i) {
      reference::poison(out.p, p.rows * p.N * 2, st.s);
      matmul_reduce_scatter(*comm, p.a_ref(a.p), p.b_ref(), 0, ReduceOp::kSum, p.out_ref(out.p), st.s,
                            with(Algorithm::kFused));
      p.check(out.p, p.ref.f(), ctx.rank, ctx.world_size, "fused reduce-scatter", st.s);
      RANK_CUDA(cudaMemcpy(now.data(), out.p, now.size(), cudaMemcpyDeviceToHost));
      if (i == 0) first = now;
      RANK_CHECK(now == first, "call ", i, " gave different bits from call 0");
    }
    return 0;
  });
}

// ASYNCTP_TRACE_TILES (read by each rank as it starts; the ranks are forked after it is set): a fused
// reduce-scatter writes one record per tile and CTA, each in time order, and the first record of every
// CTA says when its mainloop producer was past the kernel's prologue (tile_trace.h).
struct TraceDir {
  std::string path;
  TraceDir() {
    char templ[] = "/tmp/asynctp_trace_XXXXXX";
    path = mkdtemp(templ);
    setenv("ASYNCTP_TRACE_TILES", path.c_str(), 1);
  }
  ~TraceDir() {
    unsetenv("ASYNCTP_TRACE_TILES");
    std::filesystem::remove_all(path);
  }
};

int traced_reduce_scatter(RankContext& ctx, const std::string& dir) {
  auto comm = make_comm(ctx);
  Stream st;
  reference::Fp32Gemm fp32;
  // More tiles than the GPU has SMs, so that CTAs have several units (N not a multiple of 256).
  RsProblem p(ctx.world_size, ctx.rank, 2048 * ctx.world_size, 2176, 512 * ctx.world_size, st.s);
  Buf a(p.M * p.kl * 2), out(p.rows * p.N * 2);
  p.make(5, ctx.rank, a.p, p.ref.f(), fp32, st.s);
  matmul_reduce_scatter(*comm, p.a_ref(a.p), p.b_ref(), 0, ReduceOp::kSum, p.out_ref(out.p), st.s,
                        with(Algorithm::kFused));
  p.check(out.p, p.ref.f(), ctx.rank, ctx.world_size, "traced fused reduce-scatter", st.s);

  const std::string file = dir + "/rs_" + std::to_string(p.M) + "x" + std::to_string(p.N) + "x" +
                           std::to_string(p.kl) + "_rank" + std::to_string(ctx.rank) + ".csv";
  std::ifstream in(file);
  RANK_CHECK(in.good(), "no trace at ", file);
  std::string line;
  std::getline(in, line);
  RANK_CHECK(line.find(",producer_start_ns") != std::string::npos, "trace header: ", line);
  struct Record {
    int64_t m, n, start, enter, exit, done, producer;
  };
  std::map<std::pair<int64_t, int64_t>, std::vector<Record>> per_cta;  // (cluster, cta) -> its units
  std::set<std::pair<int64_t, int64_t>> tiles;
  while (std::getline(in, line)) {
    std::vector<int64_t> v;
    std::stringstream fields(line);
    for (std::string f; std::getline(fields, f, ',');) v.push_back(std::stoll(f));
    RANK_CHECK(v.size() == 14, "trace line: ", line);
    // unit,cta,cluster,m_tile,n_tile,staged,split,splits,start,fixup_enter,wait_done,fixup_exit,epilogue_done,producer
    per_cta[{v[2], v[1]}].push_back(Record{v[3], v[4], v[8], v[9], v[11], v[12], v[13]});
    tiles.insert({v[3], v[4]});
  }
  // The reduce-scatter's tiles are 192 or 256 wide, as its plan picks them for the shape.
  const int tile_n = algo::fused_rs_tile_n(ctx.world_size, DType::kBF16, p.M, p.N, p.kl, impl_of(*comm).sm_budget);
  const size_t expected = static_cast<size_t>(p.M / 128 * ((p.N + tile_n - 1) / tile_n));
  RANK_CHECK(tiles.size() == expected, "trace has ", tiles.size(), " tiles; the product has ", expected);
  for (auto& [cta, units] : per_cta) {
    std::sort(units.begin(), units.end(), [](const Record& x, const Record& y) { return x.enter < y.enter; });
    for (size_t i = 0; i < units.size(); ++i) {
      const Record& r = units[i];
      RANK_CHECK(r.start >= 0 && r.start <= r.enter && r.enter <= r.exit && r.exit <= r.done, "CTA (", cta.first,
                 ", ", cta.second, ") unit ", i, " out of order: ", r.start, " ", r.enter, " ", r.exit, " ", r.done);
      if (i == 0) {
        RANK_CHECK(r.producer >= r.start && r.producer <= r.enter, "CTA (", cta.first, ", ", cta.second,
                   "): producer start ", r.producer, " not between its start ", r.start, " and first tile ", r.enter);
      } else {
        RANK_CHECK(r.producer == -1, "CTA (", cta.first, ", ", cta.second, ") unit ", i, " has a producer start");
      }
    }
  }
  size_t most = 0;
  for (const auto& [cta, units] : per_cta) most = std::max(most, units.size());
  RANK_CHECK(most >= 2, "no CTA had a second unit; the check of later units did not run");
  std::printf("rank %d: trace of %zu tiles on %zu CTAs (up to %zu units each) in order\n", ctx.rank, tiles.size(),
              per_cta.size(), most);
  return 0;
}

TEST(FusedOps, TileTraceRecordsEveryTileAndThePrologue_MultiRank) {
  TraceDir dir;
  RUN_EVERY_WORLD_SIZE([&](RankContext& ctx) { return traced_reduce_scatter(ctx, dir.path); });
}

TEST(FusedOps, BothOpsBackToBack) {
  RUN_EVERY_WORLD_SIZE([](RankContext& ctx) {
    return calls_back_to_back(ctx, with(Algorithm::kFused, 3), with(Algorithm::kFused));
  });
}

TEST(FusedOps, BothOpsCapturedGraphReplays1000Times) {
  RUN_EVERY_WORLD_SIZE([](RankContext& ctx) {
    return graph_replays(ctx, with(Algorithm::kFused), with(Algorithm::kFused), 1000);
  });
}

TEST(FusedOps, APeerThatNeverComesEndsWithTheTimeoutReport) {
  RUN_EVERY_WORLD_SIZE([](RankContext& ctx) { return absent_peer_times_out(ctx, with(Algorithm::kFused)); });
}

TEST(FusedOps, ReduceScatterWithAPeerThatNeverComesEndsWithTheTimeoutReport) {
  RUN_EVERY_WORLD_SIZE([](RankContext& ctx) {
    return absent_peer_times_out(ctx, with(Algorithm::kFused), /*reduce_scatter=*/true);
  });
}

// Fused calls and replays stay right as the epochs wrap past 2^32 (ops_problems.h).
TEST(FusedOps, CallsAndReplaysAcrossTheEpochWrapAreRight) {
  RUN_EVERY_WORLD_SIZE([](RankContext& ctx) { return calls_across_the_epoch_wrap(ctx, with(Algorithm::kFused)); });
}

// A fused call that throws after its epoch began breaks the communicator, saying why (ops_problems.h).
TEST(FusedOps, AFailureAfterTheEpochBeganBreaksTheCommunicatorWithTheCause) {
  RUN_EVERY_WORLD_SIZE([](RankContext& ctx) {
    return failure_mid_protocol_breaks_the_communicator(ctx, with(Algorithm::kFused));
  });
  RUN_EVERY_WORLD_SIZE([](RankContext& ctx) {
    return failure_mid_protocol_breaks_the_communicator(ctx, with(Algorithm::kFused), /*reduce_scatter=*/true);
  });
}

// A graph captured before the communicator's buffers grow replays right after (ops_problems.h).
TEST(FusedOps, AGraphCapturedBeforeBuffersGrowStillReplaysRight) {
  RUN_EVERY_WORLD_SIZE([](RankContext& ctx) { return replays_after_growth(ctx, with(Algorithm::kFused)); });
}

// A call under capture that would have to grow the communicator's memory is refused (ops_problems.h).
TEST(FusedOps, GrowthUnderCaptureIsRefusedOnEveryRank) {
  RUN_EVERY_WORLD_SIZE([](RankContext& ctx) { return growth_under_capture_is_refused(ctx, with(Algorithm::kFused)); });
}

}  // namespace
}  // namespace asynctp
