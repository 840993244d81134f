#include "comm/watch_list.h"

#include <utility>

namespace asynctp::comm {

void WatchList::add(int slot, std::string what) { calls_.push_back(Call{slot, std::move(what)}); }

WatchList::Verdict WatchList::check(Clock::time_point now, const std::function<bool(int)>& started,
                                    const std::function<bool(int)>& finished) {
  Verdict v;
  while (!calls_.empty()) {
    Call& c = calls_.front();
    if (finished(c.slot)) {
      v.finished.push_back(c.slot);
      calls_.pop_front();
      continue;
    }
    if (!c.seen_started && started(c.slot)) {
      c.seen_started = true;
      c.started_at = now;
    }
    if (c.seen_started && now - c.started_at > bound_) {
      v.overdue = c.what;
      v.overdue_slot = c.slot;
      v.overdue_ms = std::chrono::duration_cast<std::chrono::milliseconds>(now - c.started_at).count();
    }
    break;  // the later calls run after this one
  }
  return v;
}

}  // namespace asynctp::comm
