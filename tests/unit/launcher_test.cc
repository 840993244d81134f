// The launcher: ranks run as processes, exchange data through it, and any failure or hang ends the
// whole job with a report naming the rank. These run without a GPU.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "asynctp/error.h"
#include "asynctp/launcher.h"

namespace asynctp {
namespace {

using State = RankOutcome::State;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

LaunchOptions quick(int timeout_ms = 30000) {
  LaunchOptions o;
  o.timeout_ms = timeout_ms;
  o.kill_grace_ms = 500;
  return o;
}

TEST(Launcher, AllRanksSucceed) {
  const LaunchResult r = launch(4, [](RankContext& ctx) { return ctx.world_size == 4 && ctx.device == ctx.rank ? 0 : 5; },
                                quick());
  EXPECT_TRUE(r.ok) << r.message;
  EXPECT_EQ(r.failed_rank, -1);
  ASSERT_EQ(r.ranks.size(), 4u);
  for (const RankOutcome& o : r.ranks) {
    EXPECT_EQ(o.state, State::kExited);
    EXPECT_EQ(o.exit_code, 0);
  }
}

TEST(Launcher, RanksRunInSeparateProcesses) {
  const pid_t parent = getpid();
  const LaunchResult r = launch(2, [parent](RankContext&) { return getpid() != parent && getppid() == parent ? 0 : 9; },
                                quick());
  EXPECT_TRUE(r.ok) << r.message;
}

TEST(Launcher, FirstDeviceOffsetsTheGpus) {
  LaunchOptions o = quick();
  o.first_device = 3;
  const LaunchResult r = launch(2, [](RankContext& ctx) { return ctx.device == 3 + ctx.rank ? 0 : 4; }, o);
  EXPECT_TRUE(r.ok) << r.message;
}

TEST(Launcher, RanksExchangeDataOverSeveralRounds) {
  const LaunchResult r = launch(
      3,
      [](RankContext& ctx) {
        for (int round = 0; round < 50; ++round) {
          // Sizes differ by rank and round, and one is empty, to exercise the framing.
          const std::string mine(static_cast<size_t>((ctx.rank * 7 + round) % 5) * 1000, static_cast<char>('a' + ctx.rank));
          const auto all = ctx.allgather(mine);
          if (all.size() != 3) return 10;
          for (int q = 0; q < 3; ++q) {
            const std::string expect(static_cast<size_t>((q * 7 + round) % 5) * 1000, static_cast<char>('a' + q));
            if (all[q] != expect) return 11;
          }
        }
        return 0;
      },
      quick());
  EXPECT_TRUE(r.ok) << r.message;
}

// No rank leaves a barrier before the last has entered it, whatever order they come in.
TEST(Launcher, BarrierHoldsEveryRankUntilTheLastArrives) {
  const LaunchResult r = launch(
      3,
      [](RankContext& ctx) {
        constexpr int kRounds = 20;
        std::string times;
        for (int round = 0; round < kRounds; ++round) {
          // A different rank comes last each round, 2 ms after the others.
          if (round % ctx.world_size == ctx.rank) std::this_thread::sleep_for(std::chrono::milliseconds(2));
          const int64_t entered = Clock::now().time_since_epoch().count();
          ctx.barrier();
          const int64_t left = Clock::now().time_since_epoch().count();
          times += std::to_string(entered) + " " + std::to_string(left) + " ";
        }
        const auto all = ctx.allgather(times);
        std::vector<std::vector<int64_t>> t(all.size());
        for (size_t q = 0; q < all.size(); ++q) {
          std::istringstream in(all[q]);
          for (int64_t v; in >> v;) t[q].push_back(v);
          if (t[q].size() != 2 * kRounds) return 20;
        }
        for (int round = 0; round < kRounds; ++round) {
          int64_t last_in = 0, first_out = INT64_MAX;
          for (const auto& q : t) {
            last_in = std::max(last_in, q[2 * round]);
            first_out = std::min(first_out, q[2 * round + 1]);
          }
          if (first_out < last_in) return 21;  // steady_clock is one clock for every process of the host
        }
        return 0;
      },
      quick());
  EXPECT_TRUE(r.ok) << r.message;
}

TEST(Launcher, BarrierTimesOutNamingTheMissingRank) {
  const LaunchResult r = launch(
      2,
      [](RankContext& ctx) {
        if (ctx.rank == 1) return 0;  // never comes
        try {
          ctx.barrier(200);
        } catch (const Error& e) {
          return std::strstr(e.what(), "rank 1 did not arrive within 200 ms") != nullptr ? 0 : 31;
        }
        return 30;
      },
      quick());
  EXPECT_TRUE(r.ok) << r.message;
}

TEST(Launcher, LargeExchangeIsDelivered) {
  const LaunchResult r = launch(
      2,
      [](RankContext& ctx) {
        std::string mine(1 << 20, static_cast<char>(ctx.rank + 1));
        const auto all = ctx.allgather(mine);
        return all[0] == std::string(1 << 20, '\1') && all[1] == std::string(1 << 20, '\2') ? 0 : 12;
      },
      quick());
  EXPECT_TRUE(r.ok) << r.message;
}

TEST(Launcher, EveryRankGetsTheSameNcclId) {
  const LaunchResult r = launch(
      3,
      [](RankContext& ctx) {
        const std::string id(reinterpret_cast<const char*>(&ctx.nccl_id), sizeof ctx.nccl_id);
        const auto all = ctx.allgather(id);
        if (id == std::string(sizeof ctx.nccl_id, '\0')) return 13;  // never filled in
        for (const auto& other : all) {
          if (other != id) return 14;
        }
        return 0;
      },
      quick());
  EXPECT_TRUE(r.ok) << r.message;
}

TEST(Launcher, FailingRankIsNamedAndTheOthersStopped) {
  const auto t0 = Clock::now();
  const LaunchResult r = launch(
      3,
      [](RankContext& ctx) {
        if (ctx.rank == 1) return 7;
        ::sleep(60);
        return 0;
      },
      quick());
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.failed_rank, 1);
  EXPECT_NE(r.message.find("rank 1 exited with code 7"), std::string::npos) << r.message;
  EXPECT_NE(r.message.find("stopped rank(s) 0, 2"), std::string::npos) << r.message;
  EXPECT_EQ(r.ranks[1].state, State::kExited);
  EXPECT_EQ(r.ranks[0].state, State::kStoppedByLauncher);
  EXPECT_EQ(r.ranks[0].signal, SIGTERM);
  EXPECT_LT(seconds_since(t0), 20.0);
}

TEST(Launcher, RankKilledBySignalIsReported) {
  const LaunchResult r = launch(
      2,
      [](RankContext& ctx) {
        if (ctx.rank == 0) ::raise(SIGSEGV);
        ::sleep(60);
        return 0;
      },
      quick());
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.failed_rank, 0);
  EXPECT_EQ(r.ranks[0].state, State::kSignaled);
  EXPECT_EQ(r.ranks[0].signal, SIGSEGV);
  EXPECT_NE(r.message.find("rank 0 was killed by SIGSEGV"), std::string::npos) << r.message;
}

TEST(Launcher, ExceptionInARankExitsWithCodeOne) {
  const LaunchResult r = launch(
      2,
      [](RankContext& ctx) -> int {
        if (ctx.rank == 1) throw Error("bad shape");
        return 0;
      },
      quick());
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.failed_rank, 1);
  EXPECT_EQ(r.ranks[1].exit_code, 1);
}

TEST(Launcher, HungRankIsStoppedAtTheTimeout) {
  const auto t0 = Clock::now();
  LaunchOptions o = quick(/*timeout_ms=*/800);
  const LaunchResult r = launch(
      2,
      [](RankContext& ctx) {
        if (ctx.rank == 1) {
          signal(SIGTERM, SIG_IGN);  // a truly stuck rank: only SIGKILL ends it
          for (;;) ::pause();
        }
        return 0;
      },
      o);
  const double took = seconds_since(t0);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.failed_rank, 1);
  EXPECT_EQ(r.ranks[0].state, State::kExited);
  EXPECT_EQ(r.ranks[1].state, State::kTimedOut);
  EXPECT_EQ(r.ranks[1].signal, SIGKILL);
  EXPECT_NE(r.message.find("timed out after 800 ms: rank(s) 1 still running"), std::string::npos) << r.message;
  EXPECT_GE(took, 0.8);
  EXPECT_LT(took, 10.0);
}

TEST(Launcher, RankThatLeavesAnExchangeFailsTheJob) {
  const auto t0 = Clock::now();
  const LaunchResult r = launch(
      2,
      [](RankContext& ctx) {
        if (ctx.rank == 0) return 0;  // never joins the exchange below
        ctx.allgather("hello");
        return 0;
      },
      [] {
        LaunchOptions o = quick();
        o.make_nccl_id = false;
        return o;
      }());
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.failed_rank, 0);
  EXPECT_NE(r.message.find("rank 0 exited with code 0 while other ranks waited for it in an exchange"),
            std::string::npos)
      << r.message;
  EXPECT_LT(seconds_since(t0), 20.0);
}

TEST(Launcher, TimeoutFromEnvironment) {
  ::setenv("ASYNCTP_LAUNCH_TIMEOUT_MS", "300", 1);
  LaunchOptions o;
  o.kill_grace_ms = 100;
  const LaunchResult r = launch(1, [](RankContext&) { ::sleep(30); return 0; }, o);
  ::unsetenv("ASYNCTP_LAUNCH_TIMEOUT_MS");
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.message.find("timed out after 300 ms"), std::string::npos) << r.message;
}

TEST(Launcher, RejectsBadArguments) {
  try {
    launch(0, [](RankContext&) { return 0; });
    FAIL() << "expected asynctp::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("world_size must be >= 1, got 0"), std::string::npos) << e.what();
  }
  EXPECT_THROW(launch(2, RankMain()), Error);
}

TEST(Launcher, ProbeReportsWhyThereIsNoGpu) {
  std::string reason;
  const int n = probe_cuda_device_count(&reason);
  EXPECT_GE(n, 0);
  if (n == 0) {
    EXPECT_FALSE(reason.empty());
  } else {
    EXPECT_TRUE(reason.empty()) << reason;
  }
  // The probe must leave this process free of CUDA: launching afterwards still works.
  EXPECT_TRUE(launch(1, [](RankContext&) { return 0; }, quick()).ok);
}

}  // namespace
}  // namespace asynctp
