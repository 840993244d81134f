// The pipelined algorithm's own cases, beyond every option combination (ops_test.cu): several pieces
// per rank, a shard kept in symmetric memory, calls enqueued back to back, 1000 replays of a captured
// CUDA graph with inputs that change between replays, and a peer that never comes.
#include <chrono>

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

int pieces_per_rank(RankContext& ctx) {
  auto comm = make_comm(ctx);
  Stream st;
  reference::Fp32Gemm fp32;
  const int ws = ctx.world_size;
  for (int chunks : {2, 3, 16}) {
    for (bool last : {false, true}) {
      run_ag_case(*comm, AgCase{{65 * ws, 72}, 200, last, false, true, 2, DType::kBF16}, st.s, fp32, pipelined(chunks));
      run_ag_case(*comm, AgCase{{512 * ws, 256}, 384, last, true, false, 1, DType::kFP16}, st.s, fp32, pipelined(chunks));
      run_rs_case(*comm, RsCase{130 * ws, 200, 72 * ws, last, false, ReduceOp::kSum, DType::kBF16, false}, st.s, fp32,
                  pipelined(chunks));
      run_rs_case(*comm, RsCase{512 * ws, 384, 256 * ws, last, true, ReduceOp::kAvg, DType::kFP16, false}, st.s, fp32,
                  pipelined(chunks));
    }
  }
  return 0;
}

TEST(PipelinedOps, SeveralPiecesPerRank_1Rank) {
  REQUIRE_GPUS(1);
  RUN_RANKS(1, pieces_per_rank);
}

TEST(PipelinedOps, SeveralPiecesPerRank_MultiRank) {
  RUN_EVERY_WORLD_SIZE(pieces_per_rank);
}

// The reduce-scatter sums the landed partials in its own GEMM's epilogue by default on two ranks; the
// sum kernel (the default on more ranks) must be right too.
int both_ways_of_summing(RankContext& ctx) {
  auto comm = make_comm(ctx);
  Stream st;
  reference::Fp32Gemm fp32;
  const int ws = ctx.world_size;
  for (const char* way : {"kernel", "gemm"}) {
    setenv("ASYNCTP_PIPELINED_RS_SUM", way, 1);
    for (int chunks : {0, 1, 3})
      for (bool last : {false, true})
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
          run_rs_case(*comm, RsCase{130 * ws, 200, 72 * ws, last, chunks == 1, op, DType::kBF16, false}, st.s, fp32,
                      pipelined(chunks));
          run_rs_case(*comm, RsCase{256 * ws, 384, 128 * ws, last, chunks != 1, op, DType::kFP16, true}, st.s, fp32,
                      pipelined(chunks));
        }
  }
  unsetenv("ASYNCTP_PIPELINED_RS_SUM");
  return 0;
}

TEST(PipelinedOps, ReduceScatterSumsInTheGemmOrInTheKernel) {
  RUN_EVERY_WORLD_SIZE(both_ways_of_summing);
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
    RANK_CHECK(comm->impl().workspace == nullptr, "the shard was copied into the workspace");
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

TEST(PipelinedOps, APeerThatNeverComesEndsWithTheTimeoutReport) {
  RUN_EVERY_WORLD_SIZE([](RankContext& ctx) { return absent_peer_times_out(ctx, pipelined()); });
}

}  // namespace
}  // namespace asynctp
