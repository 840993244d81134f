// Faults on two ranks: a peer that dies in the middle of an op, one that never makes the call, one
// that comes too late. Whatever the algorithm, the surviving rank must end with an asynctp::Error
// within its bound (or be stopped by the launcher, which names the failed rank), never hang, and
// refuse to use the communicator afterwards. (Ranks that pass different shapes: ops_test.cu.)
#include <execinfo.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <thread>

#include "ops_problems.h"

namespace asynctp {
namespace {

using namespace asynctp::testing;

constexpr int kTimeoutMs = 1500;  // every wait's bound on these ranks; the host's is twice that

// Where a surviving rank is stuck, should it be: after 12 s a watchdog makes the main thread print its
// stack to stderr (a test that hangs then says where, before the launcher stops it).
void print_stack(int) {
  void* frames[64];
  const int n = backtrace(frames, 64);
  const char header[] = "rank 0 still waiting after 12 s; its stack:\n";
  (void)!write(2, header, sizeof header - 1);
  backtrace_symbols_fd(frames, n, 2);
}

void watch_main_thread(std::atomic<bool>* done) {
  const pthread_t main_thread = pthread_self();
  signal(SIGUSR1, print_stack);
  std::thread([main_thread, done] {
    std::this_thread::sleep_for(std::chrono::seconds(12));
    if (!done->load()) pthread_kill(main_thread, SIGUSR1);
  }).detach();
}

enum class Fault {
  kExitsMidOp,    // rank 1 enqueues the op and its process exits (code 0) before the op runs
  kKilledMidOp,   // the same, but rank 1 dies of SIGKILL: the launcher must name it
  kNeverCalls,    // rank 1 never makes the call; later it makes it, too late
  kNeverCallsUnchecked,  // the same with check_across_ranks off: only the GPU-side waits can tell
  kExitsMidOpCallerWaits,  // as kExitsMidOp, but rank 0 waits with cudaStreamSynchronize, no wait of
                           // asynctp's: the watchdog (or asynctp's kernel) must end it
  kExitsMidReplay,  // as kExitsMidOpCallerWaits, but the op is a replay of a CUDA graph both captured,
                    // which the watchdog does not follow: the sequential algorithm's captured barrier,
                    // or asynctp's kernels, must end it
};

const char* fault_name(Fault f) {
  switch (f) {
    case Fault::kExitsMidOp: return "exits mid-op";
    case Fault::kKilledMidOp: return "killed mid-op";
    case Fault::kNeverCalls: return "never calls";
    case Fault::kNeverCallsUnchecked: return "never calls (no check)";
    case Fault::kExitsMidOpCallerWaits: return "exits mid-op, the caller's own wait";
    case Fault::kExitsMidReplay: return "exits mid-replay, the caller's own wait";
  }
  return "?";
}

struct Case {
  Fault fault;
  Algorithm algorithm;
  bool reduce_scatter;
};

std::string describe(const Case& c) {
  return detail::cat(fault_name(c.fault), ", ", algorithm_name(c.algorithm), " ",
                     c.reduce_scatter ? "matmul_reduce_scatter" : "all_gather_matmul");
}

int run_fault(RankContext& ctx, const Case& c) {
  OneSmallCall f(ctx, kTimeoutMs, c.reduce_scatter, 256, 512, 512, 512, 256);
  auto& comm = f.comm;
  auto& st = f.st;
  OpOptions o;
  o.algorithm = c.algorithm;
  o.check_across_ranks = c.fault != Fault::kNeverCallsUnchecked;
  std::function<void()> call = [&] { f.call(o); };
  call();  // one call together first: plans, workspace and flags exist, and the ranks are in step
  comm->synchronize(st.s);
  cudaGraphExec_t replay = nullptr;
  if (c.fault == Fault::kExitsMidReplay) {  // the op captured on every rank, and replayed once together
    cudaGraph_t graph;
    RANK_CUDA(cudaStreamBeginCapture(st.s, cudaStreamCaptureModeThreadLocal));
    call();
    RANK_CUDA(cudaStreamEndCapture(st.s, &graph));
    replay = executable_on_every_rank(ctx, graph, st.s);
    RANK_CUDA(cudaGraphLaunch(replay, st.s));
    comm->synchronize(st.s);
    call = [&] { RANK_CUDA(cudaGraphLaunch(replay, st.s)); };
  }
  ctx.allgather("in step");

  if (ctx.rank == 1) {
    if (c.fault == Fault::kExitsMidOp || c.fault == Fault::kKilledMidOp || c.fault == Fault::kExitsMidOpCallerWaits ||
        c.fault == Fault::kExitsMidReplay) {
      hold_stream<<<1, 1, 0, st.s>>>(5'000'000'000LL);
      call();  // passes the argument check with rank 0 and enqueues its part behind the hold
      std::printf("rank 1: op enqueued, %s now\n", c.fault == Fault::kKilledMidOp ? "dying" : "exiting");
      std::fflush(stdout);
      if (c.fault == Fault::kKilledMidOp) ::raise(SIGKILL);
      ::_exit(0);
    }
    // Never calls: waits until rank 0 has given up, then calls, too late.
    ctx.allgather("rank 0 gave up");
    if (c.fault == Fault::kNeverCalls) {
      std::string late;
      try {
        call();
      } catch (const Error& e) {
        late = e.what();
      }
      std::printf("rank 1, late: %s\n", late.c_str());
      RANK_CHECK(contains(late, "rank 0 gave up waiting for call"), late);
    }
    (void)comm.release();  // rank 0 is gone from this communicator: no collective teardown
    return 0;
  }

  static std::atomic<bool> done{false};
  watch_main_thread(&done);
  const auto t0 = std::chrono::steady_clock::now();
  std::string message;
  cudaError_t own_wait = cudaSuccess;
  try {
    call();
    std::printf("rank 0: op enqueued, waiting\n");
    std::fflush(stdout);
    if (c.fault == Fault::kExitsMidOpCallerWaits || c.fault == Fault::kExitsMidReplay) {
      own_wait = cudaStreamSynchronize(st.s);
    }
    comm->synchronize(st.s);
  } catch (const Error& e) {
    message = e.what();
  }
  done = true;
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("rank 0 after %.2f s: %s\n", took, message.c_str());
  std::fflush(stdout);
  RANK_CHECK(!message.empty(), "the call ended without an error although rank 1 ", fault_name(c.fault));
  // Where the watchdog ends NCCL's kernel (sequential, the caller waiting on the stream): its bound,
  // the trapping kernel's start and the driver's end of the context (about 6 s was seen after a trap).
  const bool watchdog_ends_it = c.fault == Fault::kExitsMidOpCallerWaits && c.algorithm == Algorithm::kSequential;
  RANK_CHECK(took < 2.0 * kTimeoutMs / 1000 + (watchdog_ends_it ? 10.0 : 5.0), "took ", took, " s");
  if (c.fault == Fault::kExitsMidReplay) {
    RANK_CHECK(own_wait != cudaSuccess, "cudaStreamSynchronize returned success although rank 1 exited mid-replay");
    RANK_CHECK(contains(message, "timed out after"), message);  // the captured barrier's report, or a kernel's
  }
  if (c.fault == Fault::kExitsMidOpCallerWaits) {
    RANK_CHECK(own_wait != cudaSuccess, "cudaStreamSynchronize returned success although rank 1 exited mid-op");
    // NCCL's kernel (sequential) is ended by the watchdog; asynctp's own kernels end their waits first.
    RANK_CHECK(contains(message, c.algorithm == Algorithm::kSequential ? "The watchdog put" : "timed out after"),
               message);
  }
  if (c.fault == Fault::kNeverCalls) {
    RANK_CHECK(contains(message, "rank 1 did not reach call"), message);
  } else {
    // The GPU's own report where one of asynctp's waits gave up; where an NCCL kernel waits, the
    // watchdog's (at 1.5 times the timeout) or the host's (synchronize's bound, twice the timeout).
    RANK_CHECK(contains(message, "timed out after") || contains(message, "The watchdog put") ||
                   contains(message, "NCCL reported an asynchronous error"),
               message);
  }
  std::string again;
  try {
    // A replay is the CUDA graph's, not asynctp's, and fails with the context: the communicator's own
    // next use says why.
    if (c.fault == Fault::kExitsMidReplay) {
      RANK_CHECK(cudaGraphLaunch(replay, st.s) != cudaSuccess, "a replay after the failed one launched");
      comm->synchronize(st.s);
    } else {
      call();
    }
  } catch (const Error& e) {
    again = e.what();
  }
  RANK_CHECK(contains(again, "this communicator can no longer be used"), again);
  if (c.fault == Fault::kNeverCalls || c.fault == Fault::kNeverCallsUnchecked) ctx.allgather("rank 0 gave up");
  // As the docs tell a process whose communicator broke: end without freeing, since an NCCL kernel
  // may still hold the device (freeing waits for it) or the CUDA context is gone.
  std::fflush(stdout);
  ::_exit(0);
}

const Algorithm kAlgorithms[] = {Algorithm::kSequential, Algorithm::kPipelined, Algorithm::kFused};

// Runs `fault` for every algorithm and both ops.
// ASYNCTP_TEST_ALGORITHM=<name> runs that algorithm's cases alone.
void run_every_case(Fault fault) {
  const char* only = std::getenv("ASYNCTP_TEST_ALGORITHM");
  for (const Algorithm algorithm : kAlgorithms) {
    if (only != nullptr && std::string(only) != algorithm_name(algorithm)) continue;
    for (const bool rs : {false, true}) {
      const Case c{fault, algorithm, rs};
      SCOPED_TRACE(describe(c));
      const auto t0 = std::chrono::steady_clock::now();
      LaunchOptions lo;
      lo.timeout_ms = 30000;  // a hang fails this case in 30 s (a case takes about 10), not 5 minutes
      const LaunchResult r = launch(2, [c](RankContext& ctx) { return run_fault(ctx, c); }, lo);
      const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::printf("%s: %s (%.1f s)\n", describe(c).c_str(), r.message.c_str(), took);
      if (fault == Fault::kKilledMidOp) {
        EXPECT_FALSE(r.ok);
        EXPECT_EQ(r.failed_rank, 1) << r.message;
        EXPECT_TRUE(contains(r.message, "rank 1 was killed by SIGKILL")) << r.message;
      } else if (fault == Fault::kExitsMidOpCallerWaits && algorithm == Algorithm::kSequential && !r.ok) {
        // Where NCCL's kernel, waiting on a peer whose process is gone, outlives the context's error and
        // ncclCommAbort, the watchdog ends rank 0's process after its report, and that ends the wait.
        EXPECT_EQ(r.failed_rank, 0) << r.message;
        EXPECT_TRUE(contains(r.message, "rank 0 was killed by SIGABRT")) << r.message;
        // The processes' and NCCL's set-up, then the watchdog's bound, the trap's start and its grace.
        EXPECT_LT(took, 10.0 + 1.5 * kTimeoutMs / 1000 + 10.0);
      } else {
        EXPECT_TRUE(r.ok) << r.message;
      }
      EXPECT_LT(took, 60.0);
    }
  }
}

// Why the fault tests need a process a rank: a rank ends its own, which would end every thread.
constexpr const char* kEndsAProcess = "rank 0 ends its process with _exit, and rank 1 may die";

TEST(Faults, APeerThatExitsMidOpEndsTheOthersCallWithAnError) {
  REQUIRE_GPU_PROCESSES(2, kEndsAProcess);
  run_every_case(Fault::kExitsMidOp);
}

TEST(Faults, APeerThatExitsMidOpEndsTheCallersOwnWaitOnTheStream) {
  REQUIRE_GPU_PROCESSES(2, kEndsAProcess);
  run_every_case(Fault::kExitsMidOpCallerWaits);
}

TEST(Faults, APeerThatExitsMidReplayEndsTheCallersOwnWaitOnTheStream) {
  REQUIRE_GPU_PROCESSES(2, kEndsAProcess);
  run_every_case(Fault::kExitsMidReplay);
}

TEST(Faults, APeerKilledMidOpIsNamedByTheLauncher) {
  REQUIRE_GPU_PROCESSES(2, kEndsAProcess);
  run_every_case(Fault::kKilledMidOp);
}

TEST(Faults, APeerThatNeverCallsIsNamedAndALateOneFailsToo) {
  REQUIRE_GPU_PROCESSES(2, kEndsAProcess);
  run_every_case(Fault::kNeverCalls);
}

TEST(Faults, APeerThatNeverCallsEndsTheWaitEvenWithoutTheArgumentCheck) {
  REQUIRE_GPU_PROCESSES(2, kEndsAProcess);
  run_every_case(Fault::kNeverCallsUnchecked);
}

// In-process twin of the "never calls" cases, whose process-ending surviving rank cannot run as a
// thread: rank 1 stays away from a call, and rank 0's call ends with an error naming it within the
// host check's bound; rank 1's late call then fails too, naming rank 0 (the group is aborted). Every
// algorithm, both ops, at every multi-rank world size (ranks 2 and up stay away as rank 1 does).
int never_calls_in_process(RankContext& ctx, Algorithm algorithm, bool reduce_scatter) {
  OneSmallCall f(ctx, kTimeoutMs, reduce_scatter, 256, 512, 512, 512, 256);
  OpOptions o;
  o.algorithm = algorithm;
  f.call(o);  // one call together first: plans, workspace and flags exist, and the ranks are in step
  f.comm->synchronize(f.st.s);
  ctx.allgather("in step");
  if (ctx.rank != 0) {
    ctx.allgather("rank 0 gave up");
    std::string late;
    try {
      f.call(o);
    } catch (const Error& e) {
      late = e.what();
    }
    RANK_CHECK(contains(late, "rank 0"), "rank ", ctx.rank, "'s late call did not fail naming rank 0: '", late, "'");
    (void)f.comm.release();  // the group is aborted: no collective teardown
    return 0;
  }
  const auto t0 = std::chrono::steady_clock::now();
  std::string message;
  try {
    f.call(o);
    f.comm->synchronize(f.st.s);
  } catch (const Error& e) {
    message = e.what();
  }
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("rank 0, %s %s, after %.2f s: %s\n", algorithm_name(algorithm),
              reduce_scatter ? "matmul_reduce_scatter" : "all_gather_matmul", took, message.c_str());
  RANK_CHECK(contains(message, "rank 1") && contains(message, "did not reach"), "the error does not name rank 1: '",
             message, "'");
  RANK_CHECK(took >= 0.9 * kTimeoutMs / 1000 && took < 2.0 * kTimeoutMs / 1000 + 5.0, "took ", took, " s");
  std::string again;
  try {
    f.call(o);
  } catch (const Error& e) {
    again = e.what();
  }
  RANK_CHECK(contains(again, "this communicator can no longer be used"), again);
  ctx.allgather("rank 0 gave up");
  (void)f.comm.release();
  return 0;
}

TEST(InProcess, APeerThatNeverCallsIsNamedAndALateOneFailsToo) {
  REQUIRE_GPUS(1);
  for (const Algorithm algorithm : kAlgorithms) {
    for (const bool rs : {false, true}) {
      SCOPED_TRACE(detail::cat(algorithm_name(algorithm), rs ? " matmul_reduce_scatter" : " all_gather_matmul"));
      for (const int ws : multi_rank_world_sizes()) {
        const auto t0 = std::chrono::steady_clock::now();
        RUN_RANKS_AS(ws, true, [algorithm, rs](RankContext& ctx) { return never_calls_in_process(ctx, algorithm, rs); });
        EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 60.0);
      }
    }
  }
}

// Making a communicator waits for every rank inside NCCL, which has no bound of its own: rank 1 never
// makes its communicator, and rank 0's creation ends with an error naming the call once the set-up
// bound has passed (the timeout, at least 10 s). NCCL is left as it is, so rank 0's process ends.
TEST(Faults, APeerThatNeverJoinsEndsTheOthersCreationWithAnError) {
  REQUIRE_GPU_PROCESSES(2, "NCCL is left waiting, so rank 0's process ends");
  RUN_RANK_PROCESSES(2, [](RankContext& ctx) {
    if (ctx.rank == 1) {
      ctx.allgather("rank 0 gave up");
      return 0;
    }
    const auto t0 = std::chrono::steady_clock::now();
    std::string message;
    try {
      auto comm = make_comm(ctx, kTimeoutMs);
    } catch (const Error& e) {
      message = e.what();
    }
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("rank 0 after %.2f s: %s\n", took, message.c_str());
    std::fflush(stdout);
    RANK_CHECK(contains(message, "ncclCommInitRankConfig (making the NCCL communicator) did not return within 10000 ms"),
               message);
    RANK_CHECK(took >= 9.5 && took < 20.0, "took ", took, " s");
    ctx.allgather("rank 0 gave up");
    return 0;
  });
}

}  // namespace
}  // namespace asynctp
