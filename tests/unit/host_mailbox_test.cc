// The host mailbox the ops' argument check uses on one node: ranks (processes) exchange records call
// after call without losing or mixing any, and a rank that never arrives ends the wait with an error.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "asynctp/error.h"
#include "asynctp/launcher.h"
#include "comm/host_mailbox.h"

namespace asynctp {
namespace {

// Rank 0 creates the segment, the others open it after an exchange, and the name is removed at once.
std::unique_ptr<HostMailbox> open_box(RankContext& ctx, const std::string& name) {
  std::unique_ptr<HostMailbox> box;
  if (ctx.rank == 0) box = HostMailbox::create(name, 0, ctx.world_size);
  ctx.allgather("");
  if (ctx.rank != 0) box = HostMailbox::create(name, ctx.rank, ctx.world_size);
  ctx.allgather("");
  if (ctx.rank == 0) HostMailbox::unlink(name);
  return box;
}

LaunchOptions options() {
  LaunchOptions o;
  o.timeout_ms = 60000;
  o.make_nccl_id = false;
  return o;
}

TEST(HostMailbox, TenThousandExchangesAmongThreeRanks) {
  const std::string name = "/asynctp-test-" + std::to_string(::getpid());
  const LaunchResult r = launch(
      3,
      [&](RankContext& ctx) {
        auto box = open_box(ctx, name);
        int64_t mine[HostMailbox::kSlots] = {};
        for (uint64_t seq = 1; seq <= 10000; ++seq) {
          for (int i = 0; i < HostMailbox::kSlots; ++i) mine[i] = static_cast<int64_t>(seq * 1000 + ctx.rank * 10 + i % 10);
          const int64_t* all = box->exchange(mine, seq, 10000, "test");
          for (int q = 0; q < 3; ++q) {
            for (int i = 0; i < HostMailbox::kSlots; ++i) {
              if (all[q * HostMailbox::kSlots + i] != static_cast<int64_t>(seq * 1000 + q * 10 + i % 10)) return 20;
            }
          }
        }
        return 0;
      },
      options());
  EXPECT_TRUE(r.ok) << r.message;
}

TEST(HostMailbox, ARankThatNeverArrivesEndsTheWaitWithAnErrorAndALateOneFailsToo) {
  const std::string name = "/asynctp-test-late-" + std::to_string(::getpid());
  const LaunchResult r = launch(
      2,
      [&](RankContext& ctx) {
        auto box = open_box(ctx, name);
        int64_t mine[HostMailbox::kSlots] = {};
        if (ctx.rank == 1) {
          ctx.allgather("");  // arrives only after rank 0 has given up
          try {
            box->exchange(mine, 1, 300, "all_gather_matmul");
          } catch (const Error& e) {
            return std::string(e.what()).find("all_gather_matmul: rank 0 gave up waiting for call 1 before this "
                                              "rank arrived") != std::string::npos
                       ? 0
                       : 23;
          }
          return 24;  // ran the call alone
        }
        int code = 21;
        try {
          box->exchange(mine, 1, 300, "all_gather_matmul");
        } catch (const Error& e) {
          code = std::string(e.what()).find("all_gather_matmul: rank 1 did not reach call 1 within 300 ms") !=
                         std::string::npos
                     ? 0
                     : 22;
        }
        ctx.allgather("");
        return code;
      },
      options());
  EXPECT_TRUE(r.ok) << r.message;
}

// Rank 1 arrives after rank 0's deadline has passed but before rank 0 has given up (held there by the
// test's pause): rank 0 must see it and run the call with it, not give up while rank 1 runs it alone.
TEST(HostMailbox, ARankArrivingWhileAnotherIsGivingUpRunsTheCallWithIt) {
  const std::string name = "/asynctp-test-giving-up-" + std::to_string(::getpid());
  const LaunchResult r = launch(
      2,
      [&](RankContext& ctx) {
        auto box = open_box(ctx, name);
        int64_t mine[HostMailbox::kSlots] = {};
        mine[0] = 100 + ctx.rank;
        ctx.barrier();
        if (ctx.rank == 0) HostMailbox::pause_before_giving_up_for_tests(200000);
        if (ctx.rank == 1) ::usleep(100000);  // past rank 0's 50 ms deadline, inside its pause
        const int64_t* all = box->exchange(mine, 1, 50, "test");
        return all[0] == 100 && all[HostMailbox::kSlots] == 101 ? 0 : 31;
      },
      options());
  EXPECT_TRUE(r.ok) << r.message;
}

// A rank that arrives just as another gives up: whatever the timing, both ranks fail the call or both
// run it. Rank 1 arrives around rank 0's deadline, a little before or after, trial after trial (each
// on a fresh mailbox: after a failed call the ranks make no further call on it).
TEST(HostMailbox, ARankArrivingAsAnotherGivesUpFailsOrRunsTheCallWithIt) {
  const LaunchResult r = launch(
      2,
      [&](RankContext& ctx) {
        constexpr int kTrials = 300, kTimeoutUs = 2000;
        int both_ran = 0, both_failed = 0;
        for (int t = 0; t < kTrials; ++t) {
          auto box = open_box(ctx, "/asynctp-test-edge-" + std::to_string(::getppid()) + "-" + std::to_string(t));
          ctx.barrier();
          if (ctx.rank == 1) ::usleep(kTimeoutUs * 3 / 4 + (t * 7919) % (kTimeoutUs / 2));
          int64_t mine[HostMailbox::kSlots] = {};
          bool ran = true;
          try {
            box->exchange(mine, 1, kTimeoutUs / 1000, "test");
          } catch (const Error&) {
            ran = false;
          }
          const auto all = ctx.allgather(ran ? "ran" : "failed");
          if (all[0] != all[1]) {
            std::fprintf(stderr, "trial %d: rank 0 %s, rank 1 %s\n", t, all[0].c_str(), all[1].c_str());
            return 30;
          }
          ++(ran ? both_ran : both_failed);
        }
        std::printf("rank %d: %d trials ran on both ranks, %d failed on both\n", ctx.rank, both_ran, both_failed);
        return 0;
      },
      options());
  EXPECT_TRUE(r.ok) << r.message;
}

}  // namespace
}  // namespace asynctp
