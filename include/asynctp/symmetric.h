// SymmetricBuffer: memory that every rank of the LSA team allocates at once and can address on each
// other, backed by ncclMemAlloc and an NCCL symmetric window (NCCL_WIN_COLL_SYMMETRIC).
//
// It hands out three views of the same memory:
//   local()         this rank's part, an ordinary device pointer;
//   peer(r)         rank r's part, as a pointer valid in this process: cudaMemcpyAsync can pull from it
//                   (copy engine) and kernels can load or store through it;
//   device_peers()  a device array of all peer(r), for kernels that index peers at run time;
//   window()        the NCCL window, for kernels that use NCCL's device API (ncclGetLsaPointer).
// Peer pointers are read once, at creation.
#pragma once

#include <nccl.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace asynctp {

class Communicator;

class SymmetricBuffer {
 public:
  // Collective over the communicator: every rank calls it with the same `bytes` (> 0). The size is
  // rounded up to NCCL's window alignment. The memory starts zeroed.
  static std::unique_ptr<SymmetricBuffer> create(Communicator& comm, size_t bytes);
  ~SymmetricBuffer();  // collective: deregisters the window, then frees the memory
  SymmetricBuffer(const SymmetricBuffer&) = delete;
  SymmetricBuffer& operator=(const SymmetricBuffer&) = delete;

  size_t size() const { return size_; }
  int lsa_size() const { return static_cast<int>(peers_.size()); }
  void* local() const { return local_; }
  void* peer(int lsa_rank) const;
  void* const* device_peers() const { return device_peers_; }
  // Which buffer of its communicator this is: 1 for the first made, 2 for the next, and so on. Made
  // collectively, so the same buffer has the same number on every rank.
  uint64_t serial() const { return serial_; }
  ncclWindow_t window() const { return window_; }

 private:
  SymmetricBuffer() = default;
  Communicator* comm_ = nullptr;
  void* local_ = nullptr;
  size_t size_ = 0;
  uint64_t serial_ = 0;
  ncclWindow_t window_ = nullptr;
  std::vector<void*> peers_;
  void** device_peers_ = nullptr;
};

}  // namespace asynctp
