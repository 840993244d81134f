// In-process groups: N ranks as N threads of one process, for running multi-rank code on a machine
// with fewer GPUs than ranks (one GPU, while developing) and for the tests.
//
// A communicator made on such a group runs the same ops, algorithms, kernels and flag protocols as one
// made on NCCL. Only the transport differs: symmetric memory is ordinary device memory whose peer
// pointers are the other ranks' allocations, the host-side exchanges go through process memory, and
// the collectives of the `sequential` algorithm are copies and an fp32 sum kernel. Rank r runs on
// GPU devices[r % devices.size()]; ranks that share a GPU share its SMs, so each rank's persistent
// kernels are given a share of them (CommunicatorOptions::sm_budget). Timings taken this way are not
// NVLink timings.
//
// Every host-side wait of the group is bounded by the communicator's timeout, and abort() ends those
// of every rank at once, with an asynctp::Error quoting its reason.
//
// Ranks that share a GPU share its CUDA context: a kernel that traps (a bounded wait gave up) ends
// every rank on it, and a kernel that CUDA loads lazily, at its first launch, can wait for the device
// to go idle while a peer's persistent kernel waits for this rank. Set CUDA_MODULE_LOADING=EAGER before
// the process's first CUDA call (launch() with LaunchOptions::in_process does; Communicator::
// create_in_process refuses ranks that share a GPU without it), and
// CUDA_DEVICE_MAX_CONNECTIONS=32 (it does too): a stream that waits on a peer's flag holds its hardware
// queue, and streams of different ranks that share a queue would wait on each other. Likewise, a
// rank's thread must not drain the device (cudaFree, cudaDeviceSynchronize, synchronous cudaMemset)
// while a peer may wait for it: allocate stream-ordered (cudaMallocAsync, cudaFreeAsync) or at points
// where every rank is idle. Making a communicator on such a group turns off the default memory pool's
// reuse across streams by inserted dependencies on the group's GPUs (one rank's stream would wait for
// another's).
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace asynctp {

namespace detail {
struct InProcessGroupAccess;
}  // namespace detail

struct InProcessOptions {
  // CUDA devices the ranks are spread over, rank r on devices[r % devices.size()]. Empty: every
  // device visible to the process.
  std::vector<int> devices;
};

class InProcessGroup {
 public:
  // A group of `world_size` ranks. Each rank then makes its communicator on a thread of its own
  // (Communicator::create_in_process), all at once.
  static std::shared_ptr<InProcessGroup> create(int world_size, const InProcessOptions& options = {});
  ~InProcessGroup();
  InProcessGroup(const InProcessGroup&) = delete;
  InProcessGroup& operator=(const InProcessGroup&) = delete;

  int world_size() const;
  // The CUDA device rank `rank` runs on.
  int device_of(int rank) const;
  // How many of the group's ranks run on `device`.
  int ranks_on_device(int device) const;

  // Ends every host-side wait of the group's ranks, now and later, with an asynctp::Error quoting
  // `why` (the first reason stays). For a rank that failed, so that the others do not wait for it.
  void abort(const std::string& why);
  // Empty while the group has not been aborted, else the first reason.
  std::string aborted() const;

  struct Impl;  // the group's shared state (internal)

 private:
  friend struct detail::InProcessGroupAccess;
  explicit InProcessGroup(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace asynctp
