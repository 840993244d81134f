// The host mailbox the ops' argument check uses on one node: ranks (processes) exchange records call
// after call without losing or mixing any, and a rank that never arrives ends the wait with an error.
#include <gtest/gtest.h>
#include <unistd.h>

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

}  // namespace
}  // namespace asynctp
