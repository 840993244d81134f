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
// A rank that gives up waiting records the call in `gave_up` (of its parity-0 slot), so that a rank
// arriving late fails that call too instead of running it alone.
struct HostMailbox::Slot {
  std::atomic<uint64_t> seq;
  std::atomic<uint64_t> gave_up;
  int64_t values[kSlots];
  char pad[64 - 2 * sizeof(uint64_t)];
};

std::unique_ptr<HostMailbox> HostMailbox::create(const std::string& name, int rank, int size) {
  std::unique_ptr<HostMailbox> box(new HostMailbox());
  box->rank_ = rank;
  box->size_ = size;
  box->bytes_ = sizeof(Slot) * 2 * static_cast<size_t>(size);
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

HostMailbox::Slot* HostMailbox::slot(int rank, uint64_t seq) const {
  return static_cast<Slot*>(base_) + 2 * rank + (seq & 1);
}

const int64_t* HostMailbox::exchange(const int64_t* mine, uint64_t seq, int timeout_ms, const char* what) {
  Slot* own = slot(rank_, seq);
  std::memcpy(own->values, mine, sizeof(int64_t) * kSlots);
  own->seq.store(seq, std::memory_order_release);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (int r = 0; r < size_; ++r) {
    Slot* theirs = slot(r, seq);
    for (uint32_t spin = 0; theirs->seq.load(std::memory_order_acquire) < seq; ++spin) {
      if ((spin & 1023) == 1023) {
        if (std::chrono::steady_clock::now() > deadline) {
          slot(rank_, 0)->gave_up.store(seq, std::memory_order_release);
          detail::raise(detail::cat(what, ": rank ", r, " did not reach call ", seq, " within ", timeout_ms,
                                    " ms (it is not making the same call, or it failed; ASYNCTP_TIMEOUT_MS sets the "
                                    "bound)"));
        }
        std::this_thread::yield();
      }
    }
    std::memcpy(gathered_.get() + static_cast<size_t>(r) * kSlots, theirs->values, sizeof(int64_t) * kSlots);
  }
  for (int r = 0; r < size_; ++r) {
    if (slot(r, 0)->gave_up.load(std::memory_order_acquire) >= seq) {
      detail::raise(detail::cat(what, ": rank ", r, " gave up waiting for call ", seq,
                                " before this rank arrived (this rank came more than ASYNCTP_TIMEOUT_MS late)"));
    }
  }
  return gathered_.get();
}

}  // namespace asynctp
