// The ops with each algorithm, against the reference (inputs regenerated from seeds on every rank,
// fp32 cuBLASLt GEMM): every option combination, odd shapes, on 1 rank and at every multi-rank world
// size (gpu_test.h); arguments that differ across ranks or are refused on one rank fail on every rank
// with the outputs untouched. The pipelined algorithm's own cases (chunks, a shard in symmetric memory,
// calls back to back, CUDA graph replays, an absent peer) are in ops_pipelined_test.cu, the fused
// algorithm's in ops_fused_test.cu.
#include <cstdlib>
#include <string>

#include "ops_problems.h"

namespace asynctp {
namespace {

using namespace testing;

int every_combination(RankContext& ctx, Algorithm algorithm) {
  OpOptions o;
  o.algorithm = algorithm;
  auto comm = make_comm(ctx);
  cudaStream_t s;
  RANK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  reference::Fp32Gemm fp32;
  const int ws = ctx.world_size;
  int n = run_every_ag_combination(*comm, s, fp32, o);
  for (const auto& [M, N, K] : std::vector<std::array<int64_t, 3>>{{128 * ws, 384, 256 * ws}, {130 * ws, 264, 72 * ws}})
    for (bool last : {false, true})
      for (bool col : {false, true})
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg})
          for (DType dt : {DType::kBF16, DType::kFP16})
            for (bool batch : {false, true}) {
              run_rs_case(*comm, RsCase{M, N, K, last, col, op, dt, batch}, s, fp32, o);
              ++n;
            }
  std::printf("rank %d: %s: %d cases correct\n", ctx.rank, algorithm_name(algorithm), n);
  RANK_CUDA(cudaStreamDestroy(s));
  return 0;
}

// Megatron-LM runs with CUDA_DEVICE_MAX_CONNECTIONS=1: one hardware queue per device, which every
// stream shares, so work on a side stream queues behind the caller's. Every algorithm and op must
// stay right (and end: a wait at the head of the queue would hold back what it waits for). Processes
// only, on NCCL: the in-process launcher keeps several queues for ranks that share a GPU.
TEST(AllAlgorithms, EveryCombinationWithOneDeviceConnection) {
  REQUIRE_GPU_PROCESSES(2, "each reads CUDA_DEVICE_MAX_CONNECTIONS=1 as it starts, and ranks that share a GPU keep several queues");
  // Set for the ranks' processes, forked next, which inherit it; the test's own process gets its value
  // back however the test ends.
  struct OneConnection {
    const char* before = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
    std::string saved = before != nullptr ? before : "";
    OneConnection() { ::setenv("CUDA_DEVICE_MAX_CONNECTIONS", "1", 1); }
    ~OneConnection() {
      if (before != nullptr) {
        ::setenv("CUDA_DEVICE_MAX_CONNECTIONS", saved.c_str(), 1);
      } else {
        ::unsetenv("CUDA_DEVICE_MAX_CONNECTIONS");
      }
    }
  } one_connection;
  for (Algorithm algorithm : {Algorithm::kSequential, Algorithm::kPipelined, Algorithm::kFused}) {
    SCOPED_TRACE(algorithm_name(algorithm));
    RUN_RANK_PROCESSES(2, [algorithm](RankContext& ctx) { return every_combination(ctx, algorithm); });
  }
}

TEST(SequentialOps, EveryCombination_1Rank) {
  REQUIRE_GPUS(1);
  RUN_RANKS(1, [](RankContext& ctx) { return every_combination(ctx, Algorithm::kSequential); });
}

TEST(SequentialOps, EveryCombination_MultiRank) {
  RUN_EVERY_WORLD_SIZE([](RankContext& ctx) { return every_combination(ctx, Algorithm::kSequential); });
}

TEST(PipelinedOps, EveryCombination_1Rank) {
  REQUIRE_GPUS(1);
  RUN_RANKS(1, [](RankContext& ctx) { return every_combination(ctx, Algorithm::kPipelined); });
}

TEST(PipelinedOps, EveryCombination_MultiRank) {
  RUN_EVERY_WORLD_SIZE([](RankContext& ctx) { return every_combination(ctx, Algorithm::kPipelined); });
}

// Each rank's call must end in an Error containing `expect[rank]`, with its output still all 0x5A.
int expect_refused_everywhere(RankContext& ctx, bool shapes_differ, Algorithm algorithm) {
  OpOptions o;
  o.algorithm = algorithm;
  auto comm = make_comm(ctx);
  cudaStream_t s;
  RANK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const int64_t m = (shapes_differ && ctx.rank == 1) ? 128 : 64;
  const int64_t out_bytes = ctx.world_size * m * 128 * 2;
  Buf a(m * 256 * 2 + 16), b(256 * 128 * 2), out(out_bytes);
  RANK_CUDA(cudaMemsetAsync(out.p, 0x5A, out_bytes, s));
  TensorRef ta = TensorRef::dense(a.p, DType::kBF16, {m, 256});
  if (!shapes_differ && ctx.rank == 1) ta.data = static_cast<char*>(a.p) + 2;  // misaligned on rank 1 only
  std::string message;
  try {
    all_gather_matmul(*comm, ta, {TensorRef::dense(b.p, DType::kBF16, {256, 128})}, 0,
                      {TensorRef::dense(out.p, DType::kBF16, {ctx.world_size * m, 128})}, TensorRef{}, s, o);
  } catch (const Error& e) {
    message = e.what();
  }
  std::printf("rank %d: %s\n", ctx.rank, message.c_str());
  if (shapes_differ) {
    RANK_CHECK(contains(message, "all_gather_matmul: ranks disagree on a.shape"), message);
  } else if (ctx.rank == 1) {
    RANK_CHECK(contains(message, "a_shard data pointer") && contains(message, "not 16-byte aligned"), message);
  } else {
    RANK_CHECK(contains(message, "all_gather_matmul: rank 1 refused its arguments"), message);
  }
  std::vector<unsigned char> host(out_bytes);
  RANK_CUDA(cudaMemcpyAsync(host.data(), out.p, host.size(), cudaMemcpyDeviceToHost, s));
  comm->synchronize(s);
  for (unsigned char v : host) RANK_CHECK(v == 0x5A, "the output was written to");
  // The communicator still works afterwards.
  comm->barrier(s);
  comm->synchronize(s);
  RANK_CUDA(cudaStreamDestroy(s));
  return 0;
}

TEST(SequentialOps, ShapesThatDifferAcrossRanksFailOnEveryRank) {
  RUN_EVERY_WORLD_SIZE([](RankContext& ctx) { return expect_refused_everywhere(ctx, true, Algorithm::kSequential); });
}

TEST(SequentialOps, ArgumentsRefusedOnOneRankFailOnEveryRank) {
  RUN_EVERY_WORLD_SIZE([](RankContext& ctx) { return expect_refused_everywhere(ctx, false, Algorithm::kSequential); });
}

TEST(PipelinedOps, ShapesThatDifferAcrossRanksFailOnEveryRank) {
  RUN_EVERY_WORLD_SIZE([](RankContext& ctx) { return expect_refused_everywhere(ctx, true, Algorithm::kPipelined); });
}

TEST(PipelinedOps, ArgumentsRefusedOnOneRankFailOnEveryRank) {
  RUN_EVERY_WORLD_SIZE([](RankContext& ctx) { return expect_refused_everywhere(ctx, false, Algorithm::kPipelined); });
}

TEST(FusedOps, ShapesThatDifferAcrossRanksFailOnEveryRank) {
  RUN_EVERY_WORLD_SIZE([](RankContext& ctx) { return expect_refused_everywhere(ctx, true, Algorithm::kFused); });
}

TEST(FusedOps, ArgumentsRefusedOnOneRankFailOnEveryRank) {
  RUN_EVERY_WORLD_SIZE([](RankContext& ctx) { return expect_refused_everywhere(ctx, false, Algorithm::kFused); });
}

TEST(SequentialOps, CapturedInACudaGraph) {
  RUN_EVERY_WORLD_SIZE([](RankContext& ctx) {
    auto comm = make_comm(ctx);
    cudaStream_t s;
    RANK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    reference::Fp32Gemm fp32;
    const int64_t m = 256, K = 512, N = 384, M = m * ctx.world_size;
    Buf a(m * K * 2), b(K * N * 2), out(M * N * 2), a_full(M * K * 4), b_full(K * N * 4), ref(M * N * 4);
    reference::fill(a.p, DType::kBF16, m, K, false, GenMatrix{3, m, 0}, ctx.rank * m, 0, s);
    reference::fill(b.p, DType::kBF16, K, N, false, GenMatrix{5, 0, 0}, 0, 0, s);
    reference::fill_fp32(a_full.f(), M, K, GenMatrix{3, m, 0}, 0, 0, s);
    reference::fill_fp32(b_full.f(), K, N, GenMatrix{5, 0, 0}, 0, 0, s);
    fp32.run(a_full.f(), b_full.f(), ref.f(), M, N, K, s);
    const TensorRef ta = TensorRef::dense(a.p, DType::kBF16, {m, K});
    const TensorRef tb = TensorRef::dense(b.p, DType::kBF16, {K, N});
    const TensorRef to = TensorRef::dense(out.p, DType::kBF16, {M, N});
    all_gather_matmul(*comm, ta, {tb}, 0, {to}, TensorRef{}, s);  // first call outside: plans and scratch
    comm->synchronize(s);
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    RANK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    all_gather_matmul(*comm, ta, {tb}, 0, {to}, TensorRef{}, s);
    RANK_CUDA(cudaStreamEndCapture(s, &graph));
    exec = executable_on_every_rank(ctx, graph, s);
    for (int i = 0; i < 20; ++i) {
      reference::poison(out.p, M * N * 2, s);
      RANK_CUDA(cudaGraphLaunch(exec, s));
      const auto cmp = reference::compare(out.p, DType::kBF16, M, N, ref.f(), N, 0, 0, 1.0f,
                                          reference::tolerance(DType::kBF16, 1), s);
      RANK_CHECK(cmp.ok(), "replay ", i, ": ", cmp.bad, " bad elements");
    }
    RANK_CUDA(cudaGraphExecDestroy(exec));
    RANK_CUDA(cudaGraphDestroy(graph));
    RANK_CUDA(cudaStreamDestroy(s));
    return 0;
  });
}

// A graph captured before the communicator's buffers grow replays right after (ops_problems.h).
TEST(SequentialOps, AGraphCapturedBeforeBuffersGrowStillReplaysRight) {
  RUN_EVERY_WORLD_SIZE([](RankContext& ctx) {
    OpOptions o;
    o.algorithm = Algorithm::kSequential;
    return replays_after_growth(ctx, o);
  });
}

// A call under capture that would have to grow the communicator's memory is refused (ops_problems.h).
TEST(SequentialOps, GrowthUnderCaptureIsRefusedOnEveryRank) {
  RUN_EVERY_WORLD_SIZE([](RankContext& ctx) {
    OpOptions o;
    o.algorithm = Algorithm::kSequential;
    return growth_under_capture_is_refused(ctx, o);
  });
}

}  // namespace
}  // namespace asynctp
