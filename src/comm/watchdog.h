// A communicator's watchdog: a thread that ends any of its calls that runs on the GPU past a bound.
//
// asynctp's own kernels bound every wait and trap with a report, but NCCL's kernels (the sequential
// algorithm's collectives) wait for a peer without bound, and a caller's own wait on the stream
// (cudaStreamSynchronize, torch.cuda.synchronize) has none either. So, where the transport's kernels
// can wait without bound, each uncaptured call records an event where it starts and one where it ends
// (Communicator::Impl::OrderedCall), and this thread follows them (comm/watch_list.h). A call seen
// running longer than 1.5 times the communicator's timeout, by when asynctp's own waits have given
// up, is overdue: the watchdog records a report where the next failing call finds it
// (common/device_fault.h), prints it, launches a kernel that traps, which puts this process's CUDA
// context on the GPU in error so that every later wait there fails, and makes the transport's
// waiting kernels end (NCCL's: ncclCommAbort's flag where asynctp owns the NCCL communicator, else
// the owner's CommunicatorOptions::on_overdue). Where the trapping kernel cannot start (with
// CUDA_DEVICE_MAX_CONNECTIONS=1 it queues behind the stuck call), or a wait on the call's stream
// still blocks 5 s later (a kernel that outlives the context's error and the transport's stop), the
// process is ended (SIGABRT) after the report.
// docs/design/reliability.md says why; ASYNCTP_WATCHDOG=off turns it off.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/watch_list.h"

namespace asynctp::comm {

class Watchdog {
 public:
  // For rank `rank`'s calls on GPU `device`, with the communicator's timeout. `stop_kernels` makes
  // the transport's kernels that still wait end (Transport::stop_kernels).
  Watchdog(int device, int rank, int timeout_ms, std::function<void()> stop_kernels);
  ~Watchdog();  // stops the thread; the calls still followed are left as they are
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // The bracket of one call on `stream`, not under capture: begin() records its start and returns the
  // slot that stands for it; finish() records its end, hands it to the thread, and returns the event
  // that marks the end (valid until a later call's finish(): a slot is reused only once its call has
  // ended), or null where recording failed.
  int begin(cudaStream_t stream);
  cudaEvent_t finish(int slot, cudaStream_t stream, const char* what);

  // The report once the watchdog has ended the context, else "".
  std::string report() const;

  // 1.5 times `timeout_ms`: asynctp's own waits, bounded by the timeout, give up first.
  static int bound_ms(int timeout_ms) { return timeout_ms + timeout_ms / 2; }

 private:
  struct Slot {
    cudaEvent_t start = nullptr;
    cudaEvent_t end = nullptr;
    cudaStream_t stream = nullptr;  // the call's
  };
  void run();
  void end_the_context(const std::string& what, long long ran_ms, cudaStream_t stream);

  const int device_;
  const int rank_;
  const std::function<void()> stop_kernels_;
  cudaStream_t stream_ = nullptr;  // the trapping kernel's, never waited behind the calls
  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::vector<Slot> slots_;
  std::vector<int> free_slots_;
  WatchList calls_;
  bool stop_ = false;
  std::atomic<bool> fired_{false};
  std::string report_;  // written before fired_ is set
  std::thread thread_;
};

}  // namespace asynctp::comm
