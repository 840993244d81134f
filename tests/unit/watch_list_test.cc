// comm::WatchList, the watchdog's bookkeeping, driven by a clock and GPU progress of the test's own.
#include "comm/watch_list.h"

#include <gtest/gtest.h>

#include <set>

namespace asynctp::comm {
namespace {

using std::chrono::milliseconds;

struct Gpu {
  std::set<int> started, finished;
  std::function<bool(int)> has_started() const {
    return [this](int s) { return started.count(s) > 0; };
  }
  std::function<bool(int)> has_finished() const {
    return [this](int s) { return finished.count(s) > 0; };
  }
};

const WatchList::Clock::time_point t0{};

TEST(WatchList, AFinishedCallIsHandedBackAndNeverOverdue) {
  WatchList w(milliseconds(100));
  Gpu gpu;
  w.add(3, "all_gather_matmul");
  gpu.started = {3};
  EXPECT_TRUE(w.check(t0, gpu.has_started(), gpu.has_finished()).overdue.empty());
  gpu.finished = {3};
  const WatchList::Verdict v = w.check(t0 + milliseconds(1000), gpu.has_started(), gpu.has_finished());
  EXPECT_EQ(v.finished, std::vector<int>{3});
  EXPECT_TRUE(v.overdue.empty());
  EXPECT_TRUE(w.empty());
}

TEST(WatchList, ACallIsOverdueOnlyOnceItHasRunLongerThanTheBoundSinceSeenStarted) {
  WatchList w(milliseconds(100));
  Gpu gpu;
  w.add(7, "matmul_reduce_scatter");
  // Queued behind other work for a long time: not held to account for that.
  EXPECT_TRUE(w.check(t0, gpu.has_started(), gpu.has_finished()).overdue.empty());
  EXPECT_TRUE(w.check(t0 + milliseconds(5000), gpu.has_started(), gpu.has_finished()).overdue.empty());
  gpu.started = {7};
  const auto seen = t0 + milliseconds(6000);
  EXPECT_TRUE(w.check(seen, gpu.has_started(), gpu.has_finished()).overdue.empty());
  EXPECT_TRUE(w.check(seen + milliseconds(100), gpu.has_started(), gpu.has_finished()).overdue.empty());
  const WatchList::Verdict v = w.check(seen + milliseconds(101), gpu.has_started(), gpu.has_finished());
  EXPECT_EQ(v.overdue, "matmul_reduce_scatter");
  EXPECT_EQ(v.overdue_ms, 101);
  EXPECT_EQ(v.overdue_slot, 7);
  EXPECT_TRUE(v.finished.empty());
}

TEST(WatchList, CallsAreFollowedInOrderAndTheOldestUnfinishedOneDecides) {
  WatchList w(milliseconds(100));
  Gpu gpu;
  w.add(0, "first");
  w.add(1, "second");
  w.add(2, "third");
  gpu.started = {0, 1};
  gpu.finished = {0};
  WatchList::Verdict v = w.check(t0, gpu.has_started(), gpu.has_finished());
  EXPECT_EQ(v.finished, std::vector<int>{0});
  // The second started at t0 as seen here; the third has not started and is not looked at.
  v = w.check(t0 + milliseconds(150), gpu.has_started(), gpu.has_finished());
  EXPECT_EQ(v.overdue, "second");
  EXPECT_EQ(v.overdue_slot, 1);
  gpu.finished = {0, 1, 2};
  v = w.check(t0 + milliseconds(160), gpu.has_started(), gpu.has_finished());
  EXPECT_EQ(v.finished, (std::vector<int>{1, 2}));
  EXPECT_TRUE(v.overdue.empty());
  EXPECT_TRUE(w.empty());
}

TEST(WatchList, ALaterCallIsTimedFromWhenItIsSeenStartedNotFromWhenTheFirstWas) {
  WatchList w(milliseconds(100));
  Gpu gpu;
  w.add(0, "first");
  w.add(1, "second");
  gpu.started = {0};
  (void)w.check(t0, gpu.has_started(), gpu.has_finished());
  gpu.started = {0, 1};
  gpu.finished = {0};
  EXPECT_TRUE(w.check(t0 + milliseconds(90), gpu.has_started(), gpu.has_finished()).overdue.empty());
  EXPECT_TRUE(w.check(t0 + milliseconds(180), gpu.has_started(), gpu.has_finished()).overdue.empty());
  EXPECT_EQ(w.check(t0 + milliseconds(191), gpu.has_started(), gpu.has_finished()).overdue, "second");
}

}  // namespace
}  // namespace asynctp::comm
