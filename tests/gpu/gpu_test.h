// Shared by the GPU tests: each test forks its ranks through the launcher (the test process itself
// never touches CUDA) and skips, saying why, where fewer GPUs are visible than it needs.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "asynctp/asynctp.h"

namespace asynctp::testing {

inline int visible_gpus(std::string* reason) {
  static std::string cached_reason;
  static const int count = probe_cuda_device_count(&cached_reason);
  *reason = cached_reason;
  return count;
}

inline LaunchOptions test_launch_options() {
  LaunchOptions o;
  o.timeout_ms = 300000;
  return o;
}

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

#define REQUIRE_GPUS(n)                                                                        \
  do {                                                                                         \
    std::string why_;                                                                          \
    const int have_ = ::asynctp::testing::visible_gpus(&why_);                                 \
    if (have_ < (n)) {                                                                         \
      GTEST_SKIP() << "needs " << (n) << " GPU(s), " << have_ << " visible"                    \
                   << (why_.empty() ? std::string() : " (" + why_ + ")");                     \
    }                                                                                          \
  } while (0)

// Runs `main` on `n` ranks and fails the test with the launcher's report if any rank failed.
#define RUN_RANKS(n, ...)                                                                     \
  do {                                                                                         \
    const ::asynctp::LaunchResult r_ =                                                         \
        ::asynctp::launch((n), (__VA_ARGS__), ::asynctp::testing::test_launch_options());            \
    ASSERT_TRUE(r_.ok) << r_.message;                                                          \
  } while (0)

// The world sizes a multi-rank test runs at: 2 and, where more GPUs are visible, all of them (so the
// 8-GPU machine runs each such test on 2 and on 8 ranks). ASYNCTP_TEST_WORLD_SIZES (e.g. "2,4,8")
// replaces the list; a size above the GPUs visible is skipped by RUN_EVERY_WORLD_SIZE, saying so.
// The tests' shapes assume world sizes that divide 512 (1, 2, 4, 8).
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
  sizes.push_back(2);
  if (have > 2) sizes.push_back(have);
  return sizes;
}

// RUN_RANKS at each of multi_rank_world_sizes() that the visible GPUs allow; the first failure names
// its world size. A test none of whose sizes fits is skipped, saying why, not passed.
#define RUN_EVERY_WORLD_SIZE(...)                                                              \
  do {                                                                                         \
    std::string why_;                                                                          \
    const int have_ = ::asynctp::testing::visible_gpus(&why_);                                 \
    int ran_ = 0;                                                                              \
    for (const int ws_ : ::asynctp::testing::multi_rank_world_sizes()) {                       \
      if (ws_ > have_) {                                                                       \
        std::printf("world size %d not run: %d GPU(s) visible\n", ws_, have_);                 \
        continue;                                                                              \
      }                                                                                        \
      SCOPED_TRACE(::testing::Message() << "world size " << ws_);                              \
      RUN_RANKS(ws_, __VA_ARGS__);                                                             \
      ++ran_;                                                                                  \
    }                                                                                          \
    if (ran_ == 0) {                                                                           \
      GTEST_SKIP() << "no world size in the list fits the " << have_ << " GPU(s) visible"      \
                   << (why_.empty() ? std::string() : " (" + why_ + ")");                     \
    }                                                                                          \
  } while (0)

inline std::unique_ptr<Communicator> make_comm(const RankContext& ctx, int timeout_ms = 0) {
  CommunicatorOptions o;
  o.device = ctx.device;
  o.timeout_ms = timeout_ms;
  return Communicator::create(ctx.rank, ctx.world_size, ctx.nccl_id, o);
}

}  // namespace asynctp::testing
