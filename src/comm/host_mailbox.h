// Internal: a host-side exchange among the ranks of one node, through POSIX shared memory.
//
// The ops' argument check needs every rank's few hundred bytes before any rank starts communicating.
// Through NCCL that costs GPU round trips (~20 us, exposed when the op starts with a collective); here
// it is a store and a few cache-line reads on the host. Used when the whole world is one LSA team.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace asynctp {

class HostMailbox {
 public:
  static constexpr int kSlots = 128;  // int64 values per rank and call

  // Collective among `size` ranks: rank 0 creates the segment `name`, the others open it once it
  // exists (the caller orders that); every rank maps it.
  static std::unique_ptr<HostMailbox> create(const std::string& name, int rank, int size);
  // Removes the name (the mappings stay); rank 0 calls it once every rank has opened the segment.
  static void unlink(const std::string& name);
  ~HostMailbox();

  // Publishes `mine` (kSlots values) as this rank's record for call `seq` (1, 2, ... in order on every
  // rank), waits until every rank has published `seq`, and returns the records, rank by rank
  // (size * kSlots values, valid until the next call). Throws asynctp::Error naming a rank that did
  // not arrive within timeout_ms; every rank then fails the call, a late one as it arrives (never does
  // one rank give up while another runs the call). After a failed call the ranks make no further
  // call on this mailbox (the communicator breaks): a rank still waiting for call `seq` takes a later
  // call opened by another rank as proof that every rank joined `seq`.
  const int64_t* exchange(const int64_t* mine, uint64_t seq, int timeout_ms, const char* what);

  // For tests: a pause between a rank's deadline passing and its giving up, in this process, so that a
  // peer can arrive in between (a moment too short to hit by timing alone).
  static void pause_before_giving_up_for_tests(int microseconds);

 private:
  HostMailbox() = default;
  struct Header;
  struct Slot;
  Header* header() const;
  Slot* slot(int rank, uint64_t seq) const;
  void* base_ = nullptr;
  size_t bytes_ = 0;
  int rank_ = 0, size_ = 0;
  std::unique_ptr<int64_t[]> gathered_;
};

}  // namespace asynctp
