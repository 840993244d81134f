// One communicator used from several threads, or on several streams: the calls share its scratch,
// workspace, flags and events, so they run one after another (on the host and on the GPU), and every
// result is right. Each rank's inputs are the same whichever thread or stream makes the call, so a
// result does not depend on how the calls of different ranks pair up.
#include <chrono>
#include <thread>

#include "ops_problems.h"

namespace asynctp {
namespace {

using namespace asynctp::testing;

OpOptions with(Algorithm algorithm) {
  OpOptions o;
  o.algorithm = algorithm;
  return o;
}

// Two threads of each rank, each on its own stream and outputs, 6 calls each of one op with one
// algorithm at a time (the k-th call of a rank meets the k-th of every other, whichever thread made it,
// so both threads make the same call), then the next op and algorithm.
int two_threads(RankContext& ctx) {
  BothOps t(ctx);
  InputSets in(t.ag, t.rs, 1, t.r, t.fp32, t.st.s);
  constexpr int kThreads = 2, kCalls = 6;
  for (const Algorithm algorithm : {Algorithm::kSequential, Algorithm::kPipelined, Algorithm::kFused}) {
    for (const bool reduce_scatter : {false, true}) {
      std::vector<std::string> errors(kThreads);
      std::vector<std::thread> threads;
      for (int k = 0; k < kThreads; ++k) {
        threads.emplace_back([&, k] {
          try {
            RANK_CUDA(cudaSetDevice(ctx.device));  // a new thread starts on GPU 0; this rank's buffers go on its own
            Stream s;
            Buf ag_out(t.ag.M * t.ag.N * 2), rs_out(t.rs.rows * t.rs.N * 2);
            for (int i = 0; i < kCalls; ++i) {
              const std::string what = detail::cat(reduce_scatter ? "matmul_reduce_scatter" : "all_gather_matmul",
                                                   ", thread ", k, ", call ", i, " (", algorithm_name(algorithm), ")");
              if (reduce_scatter) {
                reference::poison(rs_out.p, t.rs.rows * t.rs.N * 2, s.s);
                matmul_reduce_scatter(*t.comm, t.rs.a_ref(in.rs_a[0]->p), t.rs.b_ref(), 0, ReduceOp::kSum,
                                      t.rs.out_ref(rs_out.p), s.s, with(algorithm));
                t.rs.check(rs_out.p, in.rs_ref[0]->f(), t.r, t.ws, what.c_str(), s.s);
              } else {
                reference::poison(ag_out.p, t.ag.M * t.ag.N * 2, s.s);
                all_gather_matmul(*t.comm, t.ag.a_ref(in.ag_a[0]->p), {t.ag.b_ref()}, 0, {t.ag.out_ref(ag_out.p)},
                                  TensorRef{}, s.s, with(algorithm));
                t.ag.check(ag_out.p, in.ag_ref[0]->f(), what.c_str(), s.s);
              }
            }
          } catch (const std::exception& e) {
            errors[k] = e.what();
          }
        });
      }
      for (std::thread& th : threads) th.join();
      for (const std::string& e : errors) RANK_CHECK(e.empty(), e);
      ctx.barrier();
    }
  }
  std::printf("rank %d: %d threads x %d calls of each op and algorithm right\n", t.r, kThreads, kCalls);
  return 0;
}

// One thread, calls alternating between two streams with nothing between them, and the last rank's
// GPU held back before each call: each call must wait on the GPU for the one before it on the other
// stream (they share the communicator's memory), results checked only at the end.
int two_streams_with_skew(RankContext& ctx) {
  BothOps t(ctx);
  constexpr int kCalls = 6;
  InputSets in(t.ag, t.rs, kCalls, t.r, t.fp32, t.st.s);
  Stream other;
  for (const Algorithm algorithm : {Algorithm::kSequential, Algorithm::kPipelined, Algorithm::kFused}) {
    for (int i = 0; i < kCalls; ++i) {
      reference::poison(in.ag_out[i]->p, t.ag.M * t.ag.N * 2, t.st.s);
      reference::poison(in.rs_out[i]->p, t.rs.rows * t.rs.N * 2, t.st.s);
    }
    RANK_CUDA(cudaStreamSynchronize(t.st.s));
    for (int i = 0; i < kCalls; ++i) {
      cudaStream_t s = i % 2 ? other.s : t.st.s;
      if (t.r == t.ws - 1) hold_stream<<<1, 1, 0, s>>>(200000);  // 0.2 ms
      all_gather_matmul(*t.comm, t.ag.a_ref(in.ag_a[i]->p), {t.ag.b_ref()}, 0, {t.ag.out_ref(in.ag_out[i]->p)},
                        TensorRef{}, s, with(algorithm));
      matmul_reduce_scatter(*t.comm, t.rs.a_ref(in.rs_a[i]->p), t.rs.b_ref(), 0, ReduceOp::kSum,
                            t.rs.out_ref(in.rs_out[i]->p), s, with(algorithm));
    }
    RANK_CUDA(cudaStreamSynchronize(other.s));
    for (int i = 0; i < kCalls; ++i) {
      const std::string what = detail::cat(algorithm_name(algorithm), " call ", i, " on stream ", i % 2);
      t.ag.check(in.ag_out[i]->p, in.ag_ref[i]->f(), ("all_gather_matmul " + what).c_str(), t.st.s);
      t.rs.check(in.rs_out[i]->p, in.rs_ref[i]->f(), t.r, t.ws, ("matmul_reduce_scatter " + what).c_str(), t.st.s);
    }
  }
  std::printf("rank %d: calls on two streams right with every algorithm\n", t.r);
  return 0;
}

// A call on the legacy default stream (nullptr), then one on a non-blocking stream: the second waits
// on the GPU for the first, as for any two streams. The legacy stream holds a copy 50 ms behind a
// kernel before its barrier; the next barrier, on the other stream, must find the copy done. Ranks
// that are threads sharing a GPU would share its legacy stream too, so each rank has a GPU of its own.
int legacy_stream_then_another(RankContext& ctx) {
  auto comm = make_comm(ctx);
  Stream other;
  unsigned* x = nullptr;
  RANK_CUDA(cudaMallocAsync(reinterpret_cast<void**>(&x), sizeof *x, other.s));
  RANK_CUDA(cudaMemsetAsync(x, 0, sizeof *x, other.s));
  RANK_CUDA(cudaStreamSynchronize(other.s));
  for (unsigned round = 1; round <= 3; ++round) {
    hold_stream<<<1, 1, 0, nullptr>>>(50000000);
    RANK_CUDA(cudaMemsetAsync(x, static_cast<int>(round), sizeof *x, nullptr));
    comm->barrier(nullptr);
    comm->barrier(other.s);
    unsigned seen = 0;
    RANK_CUDA(cudaMemcpyAsync(&seen, x, sizeof seen, cudaMemcpyDeviceToHost, other.s));
    comm->synchronize(other.s);
    RANK_CHECK(seen == round * 0x01010101u, "round ", round, ": the barrier on the other stream ran before the ",
               "legacy stream's work (read ", seen, ")");
  }
  RANK_CUDA(cudaFreeAsync(x, other.s));
  comm->synchronize(other.s);
  return 0;
}

TEST(Concurrency, ACallOnTheLegacyDefaultStreamOrdersTheNextOnAnother_1Rank) {
  REQUIRE_GPUS(1);
  RUN_RANKS(1, legacy_stream_then_another);
}

TEST(Concurrency, ACallOnTheLegacyDefaultStreamOrdersTheNextOnAnother_2Ranks) {
  std::string why;
  const int have = visible_gpus(&why);
  if (have < 2) {
    GTEST_SKIP() << "needs a GPU for each of 2 ranks, " << have << " visible: ranks that are threads on one GPU "
                 << "share its legacy default stream, so their barriers on it cannot meet";
  }
  RUN_RANKS(2, legacy_stream_then_another);
}

// While a call is in flight the watchdog polls its events; a CUDA graph that another thread
// captures meanwhile in the global mode (torch.cuda.graph's default) must still be captured: a query
// from a thread in that mode would invalidate it. The call is held 300 ms on the GPU, and the capture
// spans 100 ms of it (about 20 of the watchdog's polls).
int capture_beside_a_watched_call(RankContext& ctx) {
  auto comm = make_comm(ctx);
  Stream watched, captured;
  hold_stream<<<1, 1, 0, watched.s>>>(300000000);
  comm->barrier(watched.s);
  cudaGraph_t graph = nullptr;
  RANK_CUDA(cudaStreamBeginCapture(captured.s, cudaStreamCaptureModeGlobal));
  hold_stream<<<1, 1, 0, captured.s>>>(1000);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const cudaError_t ended = cudaStreamEndCapture(captured.s, &graph);
  RANK_CHECK(ended == cudaSuccess, "the capture beside a watched call ended with ", cudaGetErrorString(ended));
  RANK_CUDA(cudaGraphDestroy(graph));
  comm->synchronize(watched.s);
  return 0;
}

TEST(Concurrency, TheWatchdogNeverBreaksAGraphCapturedInAnotherThread) {
  REQUIRE_GPUS(1);
  RUN_RANKS(1, capture_beside_a_watched_call);
}

TEST(Concurrency, TwoThreadsOnOneCommunicatorRunOneAfterAnother) {
  RUN_EVERY_WORLD_SIZE(two_threads);
}

TEST(Concurrency, CallsOnTwoStreamsAreOrderedOnTheGpuEvenWithRankSkew) {
  RUN_EVERY_WORLD_SIZE(two_streams_with_skew);
}

}  // namespace
}  // namespace asynctp
