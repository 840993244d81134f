#include "comm/host_mailbox.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "common/check.h"

namespace asynctp {

// Two slots per rank, used by call parity: a rank can be at most one call ahead of the slowest (it
// cannot finish call k+1 before everyone published k+1, which each does only after reading call k),
// so the slot it overwrites at k+2 has been read by everyone.
struct HostMailbox::Slot {
  std::atomic<uint64_t> seq;
  int64_t values[kSlots];
  char pad[64 - sizeof(uint64_t)];
};

// Whether a call runs is decided in one word that every rank changes only by compare-and-swap: each
// arriving rank adds itself to the call's count, and a rank that gives up marks the call given up only
// while the count is short. So either every rank counted itself in and all run the call, or the call
// was given up before the last one arrived and every rank fails it; a rank can neither arrive unseen
// in the moment another gives up nor give up on a call that every rank has joined.
struct HostMailbox::Header {
  std::atomic<uint64_t> verdict;  // call << 23 | given up << 22 | giver << 11 | count
  char pad[64 - sizeof(uint64_t)];
};

namespace {

constexpr uint64_t kCountBits = 11, kMaxRanks = (uint64_t{1} << kCountBits) - 1;
constexpr uint64_t kGivenUp = uint64_t{1} << (2 * kCountBits);
constexpr int kCallShift = 2 * kCountBits + 1;

uint64_t call_of(uint64_t v) { return v >> kCallShift; }
int count_of(uint64_t v) { return static_cast<int>(v & kMaxRanks); }
int giver_of(uint64_t v) { return static_cast<int>((v >> kCountBits) & kMaxRanks); }
uint64_t verdict(uint64_t call, bool given_up, int giver, int count) {
  return call << kCallShift | (given_up ? kGivenUp : 0) | static_cast<uint64_t>(giver) << kCountBits |
         static_cast<uint64_t>(count);
}

std::atomic<int> g_pause_before_giving_up_us{0};

}  // namespace

void HostMailbox::pause_before_giving_up_for_tests(int microseconds) { g_pause_before_giving_up_us = microseconds; }

std::unique_ptr<HostMailbox> HostMailbox::create(const std::string& name, int rank, int size) {
  std::unique_ptr<HostMailbox> box(new HostMailbox());
  box->rank_ = rank;
  box->size_ = size;
  ASYNCTP_CHECK(size >= 1 && static_cast<uint64_t>(size) <= kMaxRanks, "host mailbox: ", size,
                " ranks; expected 1 to ", kMaxRanks);
  box->bytes_ = sizeof(Header) + sizeof(Slot) * 2 * static_cast<size_t>(size);
  const int fd = rank == 0 ? ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600) : ::shm_open(name.c_str(), O_RDWR, 0);
  ASYNCTP_CHECK(fd >= 0, "host mailbox: shm_open(", name, ") failed: ", std::strerror(errno));
  if (rank == 0 && ::ftruncate(fd, static_cast<off_t>(box->bytes_)) != 0) {
    const int err = errno;
    ::close(fd);
    detail::raise(detail::cat("host mailbox: ftruncate(", name, ") failed: ", std::strerror(err)));
  }
  box->base_ = ::mmap(nullptr, box->bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  ASYNCTP_CHECK(box->base_ != MAP_FAILED, "host mailbox: mmap(", name, ") failed: ", std::strerror(errno));
  box->gathered_.reset(new int64_t[static_cast<size_t>(size) * kSlots]);
  return box;  // a new segment is zero-filled: every seq starts at 0
}

void HostMailbox::unlink(const std::string& name) { ::shm_unlink(name.c_str()); }

HostMailbox::~HostMailbox() {
  if (base_ && base_ != MAP_FAILED) ::munmap(base_, bytes_);
}

HostMailbox::Header* HostMailbox::header() const { return static_cast<Header*>(base_); }

HostMailbox::Slot* HostMailbox::slot(int rank, uint64_t seq) const {
  return reinterpret_cast<Slot*>(header() + 1) + 2 * rank + (seq & 1);
}

const int64_t* HostMailbox::exchange(const int64_t* mine, uint64_t seq, int timeout_ms, const char* what) {
  Slot* own = slot(rank_, seq);
  std::memcpy(own->values, mine, sizeof(int64_t) * kSlots);
  own->seq.store(seq, std::memory_order_release);
  std::atomic<uint64_t>& word = header()->verdict;
  const auto gave_up = [&](uint64_t v) {  // v: the call's own verdict, or a later call's
    const std::string who = call_of(v) == seq ? detail::cat("rank ", giver_of(v)) : std::string("a rank");
    detail::raise(detail::cat(what, ": ", who, " gave up waiting for call ", seq,
                              " before this rank arrived (this rank came more than ASYNCTP_TIMEOUT_MS late)"));
  };
  // Count this rank in: the first to arrive opens the call (the last one ended, run or given up).
  uint64_t v = word.load(std::memory_order_acquire);
  for (;;) {
    if (call_of(v) > seq || (call_of(v) == seq && (v & kGivenUp))) gave_up(v);
    const uint64_t next = call_of(v) < seq ? verdict(seq, false, 0, 1) : v + 1;
    if (word.compare_exchange_weak(v, next, std::memory_order_acq_rel, std::memory_order_acquire)) break;
  }
  // Wait until every rank has, or give the call up while one has not.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (uint32_t spin = 0;; ++spin) {
    v = word.load(std::memory_order_acquire);
    // A later call open: every rank joined this one (a rank moves on only from a full count).
    if (call_of(v) > seq || count_of(v) == size_) break;
    if (v & kGivenUp) gave_up(v);
    if ((spin & 1023) != 1023) continue;
    if (std::chrono::steady_clock::now() <= deadline) {
      std::this_thread::yield();
      continue;
    }
    if (const int pause = g_pause_before_giving_up_us.load()) std::this_thread::sleep_for(std::chrono::microseconds(pause));
    if (word.compare_exchange_strong(v, v | kGivenUp | static_cast<uint64_t>(rank_) << kCountBits,
                                     std::memory_order_acq_rel, std::memory_order_acquire)) {
      int absent = 0;
      while (absent + 1 < size_ && slot(absent, seq)->seq.load(std::memory_order_acquire) >= seq) ++absent;
      detail::raise(detail::cat(what, ": rank ", absent, " did not reach call ", seq, " within ", timeout_ms,
                                " ms (it is not making the same call, or it failed; ASYNCTP_TIMEOUT_MS sets the "
                                "bound)"));
    }
    std::this_thread::yield();
  }
  // Every rank published its record before it counted itself in.
  for (int r = 0; r < size_; ++r) {
    std::memcpy(gathered_.get() + static_cast<size_t>(r) * kSlots, slot(r, seq)->values, sizeof(int64_t) * kSlots);
  }
  return gathered_.get();
}

}  // namespace asynctp
