// Shared by the GPU tests: each test starts its ranks through the launcher (the test process itself
// never touches CUDA): one process per GPU on NCCL, or threads of one process on the in-process
// transport where fewer GPUs are visible than ranks; it skips, saying why, where neither can run.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "asynctp/asynctp.h"
#include "asynctp/launcher.h"
#include "common/check.h"  // detail::cat, in RANK_CHECK

namespace asynctp::testing {

inline int visible_gpus(std::string* reason) {
  static std::string cached_reason;
  static const int count = probe_cuda_device_count(&cached_reason);
  *reason = cached_reason;
  return count;
}

inline LaunchOptions test_launch_options() {
  LaunchOptions o;
  // Five minutes a launch, unless ASYNCTP_LAUNCH_TIMEOUT_MS says otherwise (the launcher reads it where
  // timeout_ms is 0).
  o.timeout_ms = std::getenv("ASYNCTP_LAUNCH_TIMEOUT_MS") != nullptr ? 0 : 300000;
  return o;
}

// An environment variable set for the ranks a test starts after it, and unset when the test ends. Set
// it here, before the ranks start, never inside a rank: ranks that run as threads share the process's
// environment, and a rank that reads it while another writes it may see either value.
struct ScopedEnv {
  const char* name;
  ScopedEnv(const char* n, const char* value) : name(n) { setenv(n, value, 1); }
  ~ScopedEnv() { unsetenv(name); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
};

// How a multi-rank test's ranks reach each other. ASYNCTP_TEST_TRANSPORT=nccl or in-process forces one;
// unset, NCCL (one process per GPU) where the test's ranks each have a GPU, else the in-process
// transport (the ranks as threads of one process on the GPUs there are).
inline const char* forced_transport() {
  const char* env = std::getenv("ASYNCTP_TEST_TRANSPORT");
  if (env == nullptr || *env == '\0') return nullptr;
  const std::string t = env;
  if (t != "nccl" && t != "in-process") {
    throw std::invalid_argument("ASYNCTP_TEST_TRANSPORT: '" + t + "'; expected nccl or in-process");
  }
  return env;
}

// Whether `n` ranks run in-process, given `have` GPUs (one rank runs as a process, always).
inline bool runs_in_process(int n, int have) {
  if (n <= 1) return false;
  const char* forced = forced_transport();
  if (forced != nullptr) return std::string(forced) == "in-process";
  return n > have;
}

// GPUs `n` ranks need: one each on NCCL, one in all in-process.
inline int gpus_needed(int n, int have) { return runs_in_process(n, have) ? 1 : n; }

// Throws out of a rank with a message the launcher prints; a rank's gtest assertions would not reach
// the parent.
#define RANK_CHECK(cond, ...)                                                                  \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      throw std::runtime_error(::asynctp::detail::cat(__FILE__, ":", __LINE__, ": check '", #cond, \
                                                      "' failed: ", __VA_ARGS__));             \
    }                                                                                          \
  } while (0)

#define RANK_CUDA(expr)                                                                        \
  do {                                                                                         \
    const cudaError_t e_ = (expr);                                                             \
    RANK_CHECK(e_ == cudaSuccess, #expr, " returned ", cudaGetErrorString(e_));                \
  } while (0)

// A graph each rank captured, made executable and uploaded on every rank before any launches it:
// making a graph executable can wait for the GPU, and ranks that share one must not wait so while a
// peer's replay waits for them (docs/design/transport.md, "Ranks that share a GPU").
inline cudaGraphExec_t executable_on_every_rank(const RankContext& ctx, cudaGraph_t graph, cudaStream_t s) {
  cudaGraphExec_t exec = nullptr;
  RANK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  RANK_CUDA(cudaGraphUpload(exec, s));
  RANK_CUDA(cudaStreamSynchronize(s));
  ctx.barrier();
  return exec;
}

// Skips, saying why, where `n` ranks cannot run: n GPUs for processes, or one where they run in-process.
#define REQUIRE_GPUS(n)                                                                        \
  do {                                                                                         \
    std::string why_;                                                                          \
    const int have_ = ::asynctp::testing::visible_gpus(&why_);                                 \
    const int need_ = ::asynctp::testing::gpus_needed((n), have_);                            \
    if (have_ < need_) {                                                                       \
      GTEST_SKIP() << "needs " << need_ << " GPU(s), " << have_ << " visible"                  \
                   << (why_.empty() ? std::string() : " (" + why_ + ")");                     \
    }                                                                                          \
  } while (0)

// The same for a test whose ranks must be processes of their own, one a GPU; `why` says why.
#define REQUIRE_GPU_PROCESSES(n, why)                                                          \
  do {                                                                                         \
    std::string why_;                                                                          \
    const int have_ = ::asynctp::testing::visible_gpus(&why_);                                 \
    if (have_ < (n)) {                                                                         \
      GTEST_SKIP() << "needs " << (n) << " GPU(s), " << have_ << " visible, for " << (n)         \
                   << " processes: " << (why) << (why_.empty() ? std::string() : " (" + why_ + ")"); \
    }                                                                                          \
  } while (0)

// Runs `main` on `n` ranks, in-process where runs_in_process says so, and fails the test with the
// launcher's report if any rank failed.
#define RUN_RANKS_AS(n, as_threads, ...)                                                       \
  do {                                                                                         \
    ::asynctp::LaunchOptions o_ = ::asynctp::testing::test_launch_options();                   \
    o_.in_process = (as_threads);                                                              \
    std::printf("world size %d, transport %s\n", (n), o_.in_process ? "in-process" : "nccl");  \
    const ::asynctp::LaunchResult r_ = ::asynctp::launch((n), (__VA_ARGS__), o_);             \
    ASSERT_TRUE(r_.ok) << r_.message;                                                          \
  } while (0)

#define RUN_RANKS(n, ...)                                                                      \
  do {                                                                                         \
    std::string why_;                                                                          \
    const int have_ = ::asynctp::testing::visible_gpus(&why_);                                 \
    RUN_RANKS_AS((n), ::asynctp::testing::runs_in_process((n), have_), __VA_ARGS__);           \
  } while (0)

#define RUN_RANK_PROCESSES(n, ...) RUN_RANKS_AS((n), false, __VA_ARGS__)

// The world sizes a multi-rank test runs at: 2, 3 and 4 (in-process where fewer GPUs are visible;
// the odd size finds off-by-one errors) and, where more GPUs are visible, all of them.
// ASYNCTP_TEST_WORLD_SIZES (e.g. "2,4,8") replaces the list. The tests' shapes take any of these sizes.
inline std::vector<int> multi_rank_world_sizes() {
  std::vector<int> sizes;
  if (const char* env = std::getenv("ASYNCTP_TEST_WORLD_SIZES")) {
    std::stringstream list(env);
    std::string item;
    while (std::getline(list, item, ',')) {
      const int n = std::atoi(item.c_str());
      if (n < 2) throw std::invalid_argument("ASYNCTP_TEST_WORLD_SIZES: '" + item + "' is not a world size >= 2");
      sizes.push_back(n);
    }
    return sizes;
  }
  std::string why;
  const int have = visible_gpus(&why);
  sizes = {2, 3, 4};
  if (have > 4) sizes.push_back(have);
  return sizes;
}

// RUN_RANKS at each of multi_rank_world_sizes() that can run here; the first failure names its world
// size. A test none of whose sizes can run is skipped, saying why, not passed.
#define RUN_EVERY_WORLD_SIZE(...)                                                              \
  do {                                                                                         \
    std::string why_;                                                                          \
    const int have_ = ::asynctp::testing::visible_gpus(&why_);                                 \
    int ran_ = 0;                                                                              \
    for (const int ws_ : ::asynctp::testing::multi_rank_world_sizes()) {                       \
      if (have_ < ::asynctp::testing::gpus_needed(ws_, have_)) {                               \
        std::printf("world size %d not run: %d GPU(s) visible\n", ws_, have_);                 \
        continue;                                                                              \
      }                                                                                        \
      SCOPED_TRACE(::testing::Message() << "world size " << ws_);                              \
      RUN_RANKS_AS(ws_, ::asynctp::testing::runs_in_process(ws_, have_), __VA_ARGS__);         \
      ++ran_;                                                                                  \
    }                                                                                          \
    if (ran_ == 0) {                                                                           \
      GTEST_SKIP() << "no world size in the list fits the " << have_ << " GPU(s) visible"      \
                   << (why_.empty() ? std::string() : " (" + why_ + ")");                     \
    }                                                                                          \
  } while (0)

inline std::unique_ptr<Communicator> make_comm(const RankContext& ctx, int timeout_ms = 0) {
  CommunicatorOptions o;
  o.timeout_ms = timeout_ms;
  return Communicator::create(ctx, o);
}

}  // namespace asynctp::testing
