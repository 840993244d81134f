// SignalPad: uint32 flags in a symmetric window, one array per rank, that any LSA peer can set and
// wait on, in stream order, from the host API here or from kernels (src/kernels/signal.cuh).
//
// Flags are epoch-valued: a producer writes the epoch of the call it belongs to and a waiter waits for
// flag >= epoch (compared modulo 2^32, as a signed difference), so flags never need resetting between
// calls and a captured CUDA graph that carries its epoch on the GPU replays correctly.
//
// Ordering: set() publishes after all earlier work on its stream, copy-engine copies included, is
// visible (cuStreamWriteValue32 with its default memory barrier). Work after wait() sees everything the
// setter published before it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

namespace asynctp {

class Communicator;
class SymmetricBuffer;

enum class WaitMode {
  // A one-thread kernel that spins with acquire loads and gives up after the communicator's timeout,
  // reporting rank, flag and values (then the kernel traps and the next CUDA call on this rank fails
  // with an asynctp::Error carrying that report). Costs a sliver of one SM while it waits.
  kBounded,
  // cuStreamWaitValue32: costs no SM, but cannot time out. Use it only where the matching set() is
  // certain to come (for example one enqueued earlier by this same rank).
  kStreamMemOp,
};

class SignalPad {
 public:
  // Collective over the communicator: `count` flags on every rank, all zero.
  static std::unique_ptr<SignalPad> create(Communicator& comm, int count);
  ~SignalPad();
  SignalPad(const SignalPad&) = delete;
  SignalPad& operator=(const SignalPad&) = delete;

  int count() const { return count_; }
  uint32_t* local() const;               // this rank's flags (device pointer)
  uint32_t* peer(int lsa_rank) const;    // lsa_rank's flags, mapped into this process
  uint32_t* const* device_peers() const; // device array of peer(r), for kernels

  // Stream-ordered: once earlier work on `stream` is done, flag `index` of rank `owner` := value.
  void set(cudaStream_t stream, int owner, int index, uint32_t value);
  // Stream-ordered: later work on `stream` waits until flag `index` of rank `owner` >= value.
  void wait(cudaStream_t stream, int owner, int index, uint32_t value, WaitMode mode = WaitMode::kBounded);

 private:
  SignalPad() = default;
  void check_flag(int owner, int index, const char* what) const;
  Communicator* comm_ = nullptr;
  int count_ = 0;
  std::unique_ptr<SymmetricBuffer> buffer_;
};

}  // namespace asynctp
