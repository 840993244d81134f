#include "comm/watchdog.h"

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <utility>

#include "common/check.h"
#include "common/device_fault.h"

namespace asynctp::comm {
namespace {

// Puts the CUDA context of the GPU it runs on in error: every wait there fails once the work it waits
// for has ended.
__global__ void end_the_context_kernel() { __trap(); }

// How often the thread looks for calls, idle or not. It is never woken: a call that had to wake it
// would pay a system call on the host, and a call's time starts only when the thread first sees it
// started (comm/watch_list.h), so a look that comes later costs nothing but notice.
constexpr std::chrono::milliseconds kPoll{5};
// How long the trapping kernel may take to start, and the overdue call to end after it, before the
// process is ended instead.
constexpr std::chrono::seconds kTrapStart{5};
constexpr std::chrono::seconds kEndGrace{5};

// Work on a thread left behind, and whether it has finished by a deadline: a CUDA call of the
// watchdog's may block for good where a kernel holds the GPU, and the watchdog itself must not.
class Detached {
 public:
  explicit Detached(std::function<void()> work) : shared_(std::make_shared<Shared>()) {
    std::thread([work = std::move(work), s = shared_] {
      work();
      const std::lock_guard<std::mutex> lock(s->mu);
      s->finished = true;
      s->cv.notify_all();
    }).detach();
  }
  bool finished_within(std::chrono::milliseconds bound) {
    std::unique_lock<std::mutex> lock(shared_->mu);
    return shared_->cv.wait_for(lock, bound, [&] { return shared_->finished; });
  }

 private:
  struct Shared {
    std::mutex mu;
    std::condition_variable cv;
    bool finished = false;
  };
  std::shared_ptr<Shared> shared_;
};

}  // namespace

Watchdog::Watchdog(int device, int rank, int timeout_ms, std::function<void()> stop_kernels)
    : device_(device),
      rank_(rank),
      stop_kernels_(std::move(stop_kernels)),
      calls_(std::chrono::milliseconds(bound_ms(timeout_ms))) {
  ASYNCTP_CUDA_CHECK(cudaSetDevice(device_));
  int least = 0, greatest = 0;
  ASYNCTP_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  ASYNCTP_CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, greatest));
  // The trapping kernel is loaded now. Under lazy loading (CUDA's default) its first launch would
  // load it then, and loading a module waits for the GPU, where the stuck kernel runs on.
  cudaFuncAttributes trap{};
  ASYNCTP_CUDA_CHECK(cudaFuncGetAttributes(&trap, end_the_context_kernel));
  thread_ = std::thread([this] { run(); });
}

Watchdog::~Watchdog() {
  {
    const std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_one();
  thread_.join();
  // Every call's events go, but those of a call still in flight: a stream may still record them.
  const std::lock_guard<std::mutex> lock(mu_);
  for (const Slot& s : slots_) {
    if (cudaEventQuery(s.start) == cudaErrorNotReady || cudaEventQuery(s.end) == cudaErrorNotReady) continue;
    cudaEventDestroy(s.start);
    cudaEventDestroy(s.end);
  }
  if (stream_ != nullptr && !fired_.load()) cudaStreamDestroy(stream_);
}

int Watchdog::begin(cudaStream_t stream) {
  const std::lock_guard<std::mutex> lock(mu_);
  if (free_slots_.empty()) {
    Slot made;
    ASYNCTP_CUDA_CHECK(cudaEventCreateWithFlags(&made.start, cudaEventDisableTiming));
    ASYNCTP_CUDA_CHECK(cudaEventCreateWithFlags(&made.end, cudaEventDisableTiming));
    free_slots_.push_back(static_cast<int>(slots_.size()));
    slots_.push_back(made);
  }
  const int slot = free_slots_.back();
  ASYNCTP_CUDA_CHECK(cudaEventRecord(slots_[slot].start, stream));  // on failure the slot stays free
  slots_[slot].stream = stream;
  free_slots_.pop_back();
  return slot;
}

cudaEvent_t Watchdog::finish(int slot, cudaStream_t stream, const char* what) {
  const std::lock_guard<std::mutex> lock(mu_);
  const cudaEvent_t end = slots_[slot].end;
  if (cudaEventRecord(end, stream) != cudaSuccess) {
    free_slots_.push_back(slot);  // nothing to follow: the call's own error says why
    return nullptr;
  }
  calls_.add(slot, what);
  return end;
}

std::string Watchdog::report() const {
  if (!fired_.load(std::memory_order_acquire)) return {};
  return report_;
}

void Watchdog::run() {
  // An event whose query fails belongs to a context that is gone (a kernel trapped): nothing of it
  // will finish, and nothing is left to end.
  auto done = [](cudaEvent_t e) { return cudaEventQuery(e) != cudaErrorNotReady; };
  cudaSetDevice(device_);  // this thread's CUDA calls use the communicator's GPU
  // While another thread captures a CUDA graph in the global mode (torch.cuda.graph's default), a
  // query from a thread in that mode would invalidate the capture: this thread's mode is relaxed.
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  cudaThreadExchangeStreamCaptureMode(&mode);
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    if (calls_.empty()) {
      wake_.wait_for(lock, kPoll);
      continue;
    }
    const WatchList::Verdict v = calls_.check(
        WatchList::Clock::now(), [&](int s) { return done(slots_[s].start); },
        [&](int s) { return done(slots_[s].end); });
    for (const int s : v.finished) free_slots_.push_back(s);
    if (!v.overdue.empty()) {
      const cudaStream_t stream = slots_[v.overdue_slot].stream;  // under the lock: begin() may grow slots_
      lock.unlock();
      end_the_context(v.overdue, v.overdue_ms, stream);
      return;
    }
    wake_.wait_for(lock, kPoll);
  }
}

void Watchdog::end_the_context(const std::string& what, long long ran_ms, cudaStream_t stream) {
  report_ = detail::cat(
      what, " on rank ", rank_, " ran on the GPU for ", ran_ms, " ms without finishing (the watchdog's bound is ",
      calls_.bound().count(),
      " ms, 1.5 times the communicator's timeout): a peer did not arrive (it failed, was not started, or is "
      "making a different call; ASYNCTP_TIMEOUT_MS sets the bound). The watchdog put this process's CUDA context "
      "on GPU ",
      device_,
      " in error and stopped the transport's waiting kernels where it could, so that the waits on it end: end the "
      "process (ASYNCTP_WATCHDOG=off turns the watchdog off)");
  detail::report_host_fault(report_);
  fired_.store(true, std::memory_order_release);
  std::fprintf(stderr, "asynctp: %s\n", report_.c_str());
  std::fflush(stderr);
  // A wait on the call's stream begun now, before the context is put in error, as a caller's was: a
  // wait begun after the error may return at once while the caller's still blocks. (The stream is
  // still there: a stream destroyed with work queued lives until that work ends, and this call's has
  // not.)
  const int device = device_, rank = rank_;
  Detached callers_wait([device, stream] {
    cudaSetDevice(device);
    cudaStreamSynchronize(stream);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // into cudaStreamSynchronize
  Detached trap([device, rank, on = stream_] {
    cudaSetDevice(device);
    end_the_context_kernel<<<1, 1, 0, on>>>();
    const cudaError_t launched = cudaGetLastError();
    if (launched != cudaSuccess) {
      std::fprintf(stderr, "asynctp: rank %d: the watchdog's kernel did not launch (%s)\n", rank,
                   cudaGetErrorString(launched));
      return;
    }
    while (cudaStreamQuery(on) == cudaErrorNotReady) std::this_thread::sleep_for(kPoll);
  });
  if (!trap.finished_within(kTrapStart)) {
    std::fprintf(stderr,
                 "asynctp: rank %d: the watchdog's kernel did not start within %lld s (with "
                 "CUDA_DEVICE_MAX_CONNECTIONS=1 it queues behind the stuck call): ending the process\n",
                 rank_, static_cast<long long>(kTrapStart.count()));
    std::fflush(stderr);
    std::abort();
  }
  if (stop_kernels_) stop_kernels_();
  // A kernel that neither the context's error nor the transport's stop ends holds every wait behind
  // it: only the process's end ends them.
  if (!callers_wait.finished_within(kEndGrace)) {
    std::fprintf(stderr,
                 "asynctp: rank %d: %s still runs %lld s after the watchdog put the context in error and "
                 "stopped the transport's kernels, so no wait on it can end: ending the process\n",
                 rank_, what.c_str(), static_cast<long long>(kEndGrace.count()));
    std::fflush(stderr);
    std::abort();
  }
}

}  // namespace asynctp::comm
