// What a communicator's internals do during calls: exchanges, the bounded wait, the call ordering, and
// the memory that grows (communicator_impl.h). Creation and teardown are in communicator.cc.
#include "comm/communicator_impl.h"

#include <cuda_runtime_api.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "common/check.h"
#include "common/device_fault.h"

namespace asynctp {

std::vector<std::string> Communicator::Impl::exchange(const std::string& mine, const char* what) {
  require_usable(what);
  try {
    return transport->exchange(mine, what);
  } catch (const Error& e) {
    abandon(e.what(), TransportFate::kAbort);
    throw;
  }
}

std::vector<int> Communicator::Impl::failing_ranks(bool local_ok) {
  std::vector<int> failing;
  const std::vector<std::string> all = exchange(local_ok ? "1" : "0", "Communicator: agreeing across ranks");
  for (int r = 0; r < world_size; ++r) {
    if (all[r] != "1") failing.push_back(r);
  }
  return failing;
}

void Communicator::Impl::require_usable(const char* what) const {
  // The watchdog's thread cannot write `broken` (the callers' threads read it unlocked): its report is
  // read here.
  const std::string& why = broken.empty() && watchdog ? watchdog->report() : broken;
  if (why.empty()) return;
  detail::raise(detail::cat(what, ": this communicator can no longer be used, since ", why,
                            ". Destroy it (and end the process if its CUDA context is lost) and make a new one"));
}

std::string Communicator::Impl::abandon(const std::string& why, TransportFate fate) {
  if (!broken.empty()) return {};
  broken = why;
  return transport ? transport->abandon(why, fate == TransportFate::kLeave) : std::string();
}

void Communicator::Impl::wait_bounded(cudaStream_t stream, int64_t wait_ms, const char* what) {
  require_usable(what);
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::milliseconds(wait_ms);
  auto next_poll = start;
  for (int spin = 0;; ++spin) {
    const cudaError_t e = cudaStreamQuery(stream);
    if (e == cudaSuccess) return;
    if (e != cudaErrorNotReady) {
      const std::string fault = detail::describe_device_fault();
      abandon(fault.empty() ? detail::cat("a CUDA error (", cudaGetErrorName(e), ") ended a wait") : fault,
              TransportFate::kAbort);
      detail::raise_cuda(e, detail::cat(what, ": cudaStreamQuery").c_str(), __FILE__, __LINE__);
    }
    const auto now = Clock::now();
    if (now >= next_poll) {
      // A peer that died can surface here first (NCCL's ncclRemoteError, an aborted in-process group).
      const std::string async = transport->async_error();
      if (!async.empty()) {
        const std::string why = detail::cat(async, " while ", what, " waited");
        const std::string aborted = abandon(why, TransportFate::kLeave);
        detail::raise(detail::cat(what, ": ", why, aborted, "; this communicator can no longer be used"));
      }
      next_poll = now + std::chrono::milliseconds(10);
    }
    if (now >= deadline) break;
    // Short waits stay responsive; a long one stops costing a core.
    if (spin < 4096) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
  const std::string why = detail::cat(what, " timed out after ", wait_ms,
                                      " ms: a peer did not arrive (it failed, was not started, or is making a "
                                      "different call; ASYNCTP_TIMEOUT_MS sets the bound)");
  const std::string aborted = abandon(why, TransportFate::kLeave);
  detail::raise(detail::cat(why, aborted));
}

void Communicator::Impl::quiesce(const char* what) {
  transport->settle(what);
  ASYNCTP_CUDA_CHECK(cudaDeviceSynchronize());
  transport->settle(what);
}

void* Communicator::Impl::scratch_for(size_t bytes, cudaStream_t stream) {
  if (bytes > scratch_bytes) {
    refuse_growth_under_capture(stream, "scratch", bytes, scratch_bytes);
    // Stream-ordered: the old scratch's last use (this rank's previous call) is ordered before `stream`.
    if (scratch && graphs_captured) {
      retired_scratch.push_back(scratch);
    } else if (scratch) {
      ASYNCTP_CUDA_CHECK(cudaFreeAsync(scratch, stream));
    }
    scratch = nullptr;
    scratch_bytes = 0;
    ASYNCTP_CUDA_CHECK(cudaMallocAsync(&scratch, bytes, stream));
    scratch_bytes = bytes;
  }
  return scratch;
}

SymmetricBuffer& Communicator::Impl::workspace_for(Communicator& comm, size_t bytes, cudaStream_t stream) {
  if (!workspace || workspace->size() < bytes) {
    refuse_growth_under_capture(stream, "symmetric workspace", bytes, workspace ? workspace->size() : 0);
  }
  return comm.workspace(bytes);
}

Communicator::Impl::OrderedCall::OrderedCall(Impl& m, cudaStream_t stream, const char* what)
    : m_(m), lock_(m.call_mutex), stream_(stream), what_(what) {
  m.require_usable(what);
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  ASYNCTP_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  captured_ = capture != cudaStreamCaptureStatusNone;
  if (!captured_ && m.last_stream.has_value() && *m.last_stream != stream) {
    ASYNCTP_CUDA_CHECK(cudaStreamWaitEvent(stream, m.last_end, 0));
  }
  if (!captured_ && m.watchdog) watched_ = m.watchdog->begin(stream);
}

Communicator::Impl::OrderedCall::~OrderedCall() {
  if (captured_) return;
  cudaEvent_t end = watched_ >= 0 ? m_.watchdog->finish(watched_, stream_, what_) : nullptr;
  if (end == nullptr) {
    if (cudaEventRecord(m_.last_call_end, stream_) != cudaSuccess) return;
    end = m_.last_call_end;
  }
  m_.last_end = end;
  m_.last_stream = stream_;
}

void Communicator::Impl::refuse_growth_under_capture(cudaStream_t stream, const char* what, size_t needed,
                                                      size_t held) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  ASYNCTP_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  ASYNCTP_CHECK(capture == cudaStreamCaptureStatusNone, "this call needs ", needed, " bytes of ", what,
                " and the communicator holds ", held, "; it cannot grow under CUDA graph capture: make one call of ",
                "this size outside capture first");
}

void Communicator::Impl::retire(std::unique_ptr<SymmetricBuffer> buffer) {
  if (buffer && graphs_captured) retired_buffers.push_back(std::move(buffer));
}

}  // namespace asynctp
