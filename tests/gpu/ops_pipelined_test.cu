// The pipelined algorithm's own cases, beyond every option combination (ops_test.cu): several chunks
// per rank, a shard kept in symmetric memory, calls enqueued back to back, 1000 replays of a captured
// CUDA graph with inputs that change between replays, repeated layouts replayed from graphs of the
// library's own, and a peer that never comes.
#include <chrono>

#include "algo/overlap_resources.h"
#include "algo/resources.h"
#include "comm/communicator_impl.h"
#include "ops_problems.h"

namespace asynctp {
namespace {

using namespace testing;

OpOptions pipelined(int chunks = 0) {
  OpOptions o;
  o.algorithm = Algorithm::kPipelined;
  o.chunks_per_rank = chunks;
  return o;
}

int chunks_per_rank(RankContext& ctx) {
  auto comm = make_comm(ctx);
  Stream st;
  reference::Fp32Gemm fp32;
  const int ws = ctx.world_size;
  for (int chunks : {2, 3, 16}) {
    for (bool last : {false, true}) {
      run_ag_case(*comm, AgCase{{65 * ws, 72}, 200, last, false, true, 2, DType::kBF16}, st.s, fp32, pipelined(chunks));
      run_ag_case(*comm, AgCase{{512 * ws, 128 * ws}, 384, last, true, false, 1, DType::kFP16}, st.s, fp32, pipelined(chunks));
      run_rs_case(*comm, RsCase{130 * ws, 264, 72 * ws, last, false, ReduceOp::kSum, DType::kBF16, false}, st.s, fp32,
                  pipelined(chunks));
      run_rs_case(*comm, RsCase{512 * ws, 384, 256 * ws, last, true, ReduceOp::kAvg, DType::kFP16, false}, st.s, fp32,
                  pipelined(chunks));
    }
  }
  return 0;
}

TEST(PipelinedOps, SeveralChunksPerRank_1Rank) {
  REQUIRE_GPUS(1);
  RUN_RANKS(1, chunks_per_rank);
}

TEST(PipelinedOps, SeveralChunksPerRank_MultiRank) {
  RUN_EVERY_WORLD_SIZE(chunks_per_rank);
}

// The reduce-scatter sums the landed partials in its own GEMM's epilogue by default on two ranks; the
// sum kernel (the default on more ranks) must be right too. ASYNCTP_PIPELINED_RS_SUM chooses.
int rs_cases_summed(RankContext& ctx) {
  auto comm = make_comm(ctx);
  Stream st;
  reference::Fp32Gemm fp32;
  const int ws = ctx.world_size;
  for (int chunks : {0, 1, 3})
    for (bool last : {false, true})
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
        run_rs_case(*comm, RsCase{130 * ws, 264, 72 * ws, last, chunks == 1, op, DType::kBF16, false}, st.s, fp32,
                    pipelined(chunks));
        run_rs_case(*comm, RsCase{256 * ws, 384, 128 * ws, last, chunks != 1, op, DType::kFP16, true}, st.s, fp32,
                    pipelined(chunks));
      }
  return 0;
}

TEST(PipelinedOps, ReduceScatterSummedByTheKernel) {
  ScopedEnv way("ASYNCTP_PIPELINED_RS_SUM", "kernel");
  RUN_EVERY_WORLD_SIZE(rs_cases_summed);
}

// (On two ranks; more sum in the kernel whatever is asked.)
TEST(PipelinedOps, ReduceScatterSummedInTheGemm) {
  ScopedEnv way("ASYNCTP_PIPELINED_RS_SUM", "gemm");
  RUN_EVERY_WORLD_SIZE(rs_cases_summed);
}

TEST(PipelinedOps, ShardInSymmetricMemoryIsReadInPlace) {
  RUN_EVERY_WORLD_SIZE([](RankContext& ctx) {
    auto comm = make_comm(ctx);
    Stream st;
    reference::Fp32Gemm fp32;
    AgProblem p(ctx.world_size, 192, 256, 320, st.s);
    const size_t offset = 4096;  // the shard need not start the buffer
    auto sym = SymmetricBuffer::create(*comm, offset + p.m * p.K * 2);
    void* a = static_cast<char*>(sym->local()) + offset;
    Buf out(p.M * p.N * 2);
    for (uint64_t seed : {11u, 12u, 13u}) {
      p.make(seed, ctx.rank, a, p.ref.f(), fp32, st.s);
      reference::poison(out.p, p.M * p.N * 2, st.s);
      all_gather_matmul(*comm, p.a_ref(a), {p.b_ref()}, 0, {p.out_ref(out.p)}, TensorRef{}, st.s, pipelined());
      // Overwriting the shard right after the call (stream-ordered) must not reach the peers' results.
      reference::poison(a, p.m * p.K * 2, st.s);
      p.check(out.p, p.ref.f(), "symmetric shard", st.s);
    }
    RANK_CHECK(impl_of(*comm).workspace == nullptr, "the shard was copied into the workspace");
    comm->barrier(st.s);
    comm->synchronize(st.s);
    return 0;
  });
}

// Peers read a shard in symmetric memory in place, at its offset in the same buffer of theirs: rank 0's
// shard in one buffer and the others' in another, at the same offset, is refused on every rank.
TEST(PipelinedOps, ShardsInDifferentSymmetricBuffersAcrossRanksAreRefused) {
  RUN_EVERY_WORLD_SIZE([](RankContext& ctx) {
    auto comm = make_comm(ctx);
    Stream st;
    AgProblem p(ctx.world_size, 192, 256, 320, st.s);
    auto first = SymmetricBuffer::create(*comm, p.m * p.K * 2);
    auto second = SymmetricBuffer::create(*comm, p.m * p.K * 2);
    void* a = (ctx.rank == 0 ? first : second)->local();
    Buf out(p.M * p.N * 2);
    std::string message;
    try {
      all_gather_matmul(*comm, p.a_ref(a), {p.b_ref()}, 0, {p.out_ref(out.p)}, TensorRef{}, st.s, pipelined());
    } catch (const Error& e) {
      message = e.what();
    }
    RANK_CHECK(contains(message, "all_gather_matmul: ranks disagree on a_shard's symmetric buffer"), message);
    comm->barrier(st.s);
    comm->synchronize(st.s);
    return 0;
  });
}

TEST(PipelinedOps, CallsBackToBackWithoutWaiting) {
  RUN_EVERY_WORLD_SIZE([](RankContext& ctx) { return calls_back_to_back(ctx, pipelined(), pipelined()); });
}

TEST(PipelinedOps, CapturedGraphReplays1000TimesWithChangingInputs) {
  RUN_EVERY_WORLD_SIZE([](RankContext& ctx) { return graph_replays(ctx, pipelined(), pipelined(), 1000); });
}

// Outside graph capture, a pipelined call whose layout (shapes, options, pointers) was used before
// runs as the replay of a graph recorded from it (OverlapResources::enqueue_call). The calls go through
// eight layouts of each op, two inputs by two outputs by two chunk counts, in an irregular order, each
// output poisoned first: a replay that read another call's input, wrote another call's output or ran
// another layout's chunks would leave wrong or poisoned elements.
int repeated_layouts(RankContext& ctx) {
  BothOps t(ctx);
  auto& comm = t.comm;
  auto& st = t.st;
  auto& ag = t.ag;
  auto& rs = t.rs;
  const int ws = t.ws, r = t.r;
  InputSets in(ag, rs, 2, r, t.fp32, st.s);
  Buf ag_out(ag.M * ag.N * 2), rs_out(rs.rows * rs.N * 2);
  // The workspace at its largest first: a call that grows it moves it (the address is in the layout),
  // so the layouts recorded before would be recorded again.
  (void)comm->workspace(8u << 20);
  constexpr int kCalls = 48, kLayouts = 8;
  for (int i = 0; i < kCalls; ++i) {
    const int layout = (i * 5 + i / 16) % kLayouts;  // each of the 8, in an order that shifts
    const int v = layout & 1, w = (layout >> 1) & 1, chunks = (layout & 4) ? 2 : 0;
    void* ag_dst = w ? ag_out.p : in.ag_out[v]->p;
    void* rs_dst = w ? rs_out.p : in.rs_out[v]->p;
    reference::poison(ag_dst, ag.M * ag.N * 2, st.s);
    reference::poison(rs_dst, rs.rows * rs.N * 2, st.s);
    all_gather_matmul(*comm, ag.a_ref(in.ag_a[v]->p), {ag.b_ref()}, 0, {ag.out_ref(ag_dst)}, TensorRef{}, st.s,
                      pipelined(chunks));
    matmul_reduce_scatter(*comm, rs.a_ref(in.rs_a[v]->p), rs.b_ref(), 0, ReduceOp::kSum, rs.out_ref(rs_dst), st.s,
                          pipelined(chunks));
    const std::string what = detail::cat(" call ", i, " (input ", v, ", output ", w, ", chunks ", chunks, ")");
    ag.check(ag_dst, in.ag_ref[v]->f(), ("all_gather_matmul" + what).c_str(), st.s);
    rs.check(rs_dst, in.rs_ref[v]->f(), r, ws, ("matmul_reduce_scatter" + what).c_str(), st.s);
  }
  // Each layout's first call is enqueued directly; every later one is a replay, unless ranks share the
  // GPU, where none is.
  const algo::OverlapResources& pr = *algo::Resources::of(*comm).overlap;
  const uint64_t replayed = pr.replayed_calls(), expected = pr.replays_off() ? 0 : 2 * (kCalls - kLayouts);
  RANK_CHECK(replayed == expected, "replayed calls: ", replayed, ", expected ", expected);

  std::printf("rank %d: %d calls of each op correct, %llu replayed\n", r, kCalls,
              static_cast<unsigned long long>(replayed));
  return 0;
}

TEST(PipelinedOps, RepeatedLayoutsRunAsGraphReplays) {
  RUN_EVERY_WORLD_SIZE(repeated_layouts);
}

// ASYNCTP_PIPELINED_EAGER=1 (read as a communicator's first overlapped call sets up; the ranks are
// forked after it is set) enqueues every call directly.
TEST(PipelinedOps, EagerCallsWhereAskedAreNeverReplayed) {
  ScopedEnv eager("ASYNCTP_PIPELINED_EAGER", "1");
  RUN_EVERY_WORLD_SIZE([](RankContext& ctx) {
    BothOps t(ctx);
    InputSets in(t.ag, t.rs, 1, t.r, t.fp32, t.st.s);
    for (int i = 0; i < 3; ++i) {
      reference::poison(in.ag_out[0]->p, t.ag.M * t.ag.N * 2, t.st.s);
      all_gather_matmul(*t.comm, t.ag.a_ref(in.ag_a[0]->p), {t.ag.b_ref()}, 0, {t.ag.out_ref(in.ag_out[0]->p)},
                        TensorRef{}, t.st.s, pipelined());
      t.ag.check(in.ag_out[0]->p, in.ag_ref[0]->f(), detail::cat("all_gather_matmul call ", i).c_str(), t.st.s);
    }
    const uint64_t replayed = algo::Resources::of(*t.comm).overlap->replayed_calls();
    RANK_CHECK(replayed == 0, "ASYNCTP_PIPELINED_EAGER=1, yet ", replayed, " calls were replayed");
    return 0;
  });
}

TEST(PipelinedOps, APeerThatNeverComesEndsWithTheTimeoutReport) {
  RUN_EVERY_WORLD_SIZE([](RankContext& ctx) { return absent_peer_times_out(ctx, pipelined()); });
}

// Pipelined calls and replays stay right as the epochs wrap past 2^32 (ops_problems.h).
TEST(PipelinedOps, CallsAndReplaysAcrossTheEpochWrapAreRight) {
  RUN_EVERY_WORLD_SIZE([](RankContext& ctx) { return calls_across_the_epoch_wrap(ctx, pipelined()); });
}

// A pipelined call that throws after its epoch began breaks the communicator, saying why
// (ops_problems.h).
TEST(PipelinedOps, AFailureAfterTheEpochBeganBreaksTheCommunicatorWithTheCause) {
  RUN_EVERY_WORLD_SIZE([](RankContext& ctx) { return failure_mid_protocol_breaks_the_communicator(ctx, pipelined()); });
  RUN_EVERY_WORLD_SIZE([](RankContext& ctx) {
    return failure_mid_protocol_breaks_the_communicator(ctx, pipelined(), /*reduce_scatter=*/true);
  });
}

// A graph captured before the communicator's buffers grow replays right after (ops_problems.h).
TEST(PipelinedOps, AGraphCapturedBeforeBuffersGrowStillReplaysRight) {
  RUN_EVERY_WORLD_SIZE([](RankContext& ctx) { return replays_after_growth(ctx, pipelined()); });
}

// A call under capture that would have to grow the communicator's memory is refused (ops_problems.h).
TEST(PipelinedOps, GrowthUnderCaptureIsRefusedOnEveryRank) {
  RUN_EVERY_WORLD_SIZE([](RankContext& ctx) { return growth_under_capture_is_refused(ctx, pipelined()); });
}

}  // namespace
}  // namespace asynctp
