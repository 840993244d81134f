// Internal: what an InProcessGroup holds. Its ranks are threads of this process; they meet in
// exchange(), a host-side all-gather that every rank calls the same number of times.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "asynctp/in_process.h"

namespace asynctp {

struct InProcessGroup::Impl {
  int world_size = 0;
  std::vector<int> devices;  // rank r on devices[r % devices.size()]

  // Collective among the group's ranks: publishes `mine` as rank `rank`'s part of its next exchange
  // and returns every rank's part, by rank. Throws asynctp::Error naming `what` and the ranks that did
  // not arrive within `timeout_ms`, or quoting the reason where the group was aborted (then, or while
  // this rank waited). A rank that gives up aborts the group: the ranks are out of step from then on.
  std::vector<std::string> exchange(int rank, const std::string& mine, int timeout_ms, const char* what);

  void abort(const std::string& why);
  std::string aborted() const;

 private:
  mutable std::mutex mu_;
  std::condition_variable changed_;
  std::string aborted_;
  // Round k of exchange(): parts_[k % 2], filled by every rank, read by every rank before round k + 2
  // (a rank cannot enter round k + 1's wait before every rank has published round k + 1, which each
  // does only after it has read round k).
  uint64_t published_[2] = {0, 0};  // ranks that published into each of the two buffers
  uint64_t round_of_[2] = {0, 0};   // which round each buffer holds
  std::vector<std::string> parts_[2];
  std::vector<uint64_t> rounds_;    // per rank: exchanges entered
};

namespace detail {
struct InProcessGroupAccess {
  static InProcessGroup::Impl& of(InProcessGroup& group) { return *group.impl_; }
};
}  // namespace detail

// The shared state of `group`; for the library's own transport and launcher.
inline InProcessGroup::Impl& impl_of(InProcessGroup& group) { return detail::InProcessGroupAccess::of(group); }

}  // namespace asynctp
