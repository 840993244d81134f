// The calls a communicator's watchdog follows (comm/watchdog.h), oldest first, and when one of them has
// run too long. No CUDA here: the caller says whether a call has started and finished on the GPU (its
// events), and what time it is.
#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <string>
#include <vector>

namespace asynctp::comm {

class WatchList {
 public:
  using Clock = std::chrono::steady_clock;

  // A call counts as overdue once it has been seen started for longer than `bound`.
  explicit WatchList(std::chrono::milliseconds bound) : bound_(bound) {}

  // Follows the call `what`, whose start and end the caller's `slot` stands for. Calls finish in the
  // order they are added (a communicator's calls run one after another on the GPU).
  void add(int slot, std::string what);

  struct Verdict {
    std::vector<int> finished;  // slots of calls that finished: the caller may reuse them
    std::string overdue;        // the oldest unfinished call's `what` once it is overdue, else ""
    long long overdue_ms = 0;   // how long it has run since it was seen started
    int overdue_slot = -1;      // its slot, or -1
  };
  // Looks at the oldest calls at `now`. `started(slot)` and `finished(slot)` say what the GPU has done.
  // A call's time starts when it is first seen started here, not when it was added: a call queued
  // behind other work, or whose host part took long, is not held to account for that.
  Verdict check(Clock::time_point now, const std::function<bool(int)>& started,
                const std::function<bool(int)>& finished);

  bool empty() const { return calls_.empty(); }
  std::chrono::milliseconds bound() const { return bound_; }

 private:
  struct Call {
    int slot;
    std::string what;
    bool seen_started = false;
    Clock::time_point started_at{};
  };
  std::chrono::milliseconds bound_;
  std::deque<Call> calls_;
};

}  // namespace asynctp::comm
