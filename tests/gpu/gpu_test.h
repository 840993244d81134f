// Shared by the GPU tests: each test forks its ranks through the launcher (the test process itself
// never touches CUDA) and skips, saying why, where fewer GPUs are visible than it needs.
#pragma once

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

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

inline std::unique_ptr<Communicator> make_comm(const RankContext& ctx, int timeout_ms = 0) {
  CommunicatorOptions o;
  o.device = ctx.device;
  o.timeout_ms = timeout_ms;
  return Communicator::create(ctx.rank, ctx.world_size, ctx.nccl_id, o);
}

}  // namespace asynctp::testing
