// Internal: what a Communicator holds. The library's algorithms and kernels reach it through impl_of().
#pragma once

#include <cublasLt.h>

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "asynctp/communicator.h"
#include "asynctp/signal.h"
#include "asynctp/symmetric.h"
#include "comm/attachment.h"
#include "comm/host_mailbox.h"
#include "comm/transport.h"
#include "comm/watchdog.h"
#include "common/device_fault.h"

namespace asynctp {

// int64 slots each rank contributes to an argument check (see ops/cross_rank_check.cc).
constexpr int kCheckSlots = 128;

struct Communicator::Impl {
  // How the ranks reach each other (NCCL, or threads of one process): comm/transport.h.
  std::unique_ptr<comm::Transport> transport;
  int rank = 0;
  int world_size = 1;
  int device = 0;
  int timeout_ms = 0;
  int signal_count = 0;
  // SMs each of this rank's persistent kernels may use (CommunicatorOptions::sm_budget, resolved).
  int sm_budget = 0;
  // Ranks of this communicator on this rank's GPU (1 but for an in-process group with fewer GPUs than
  // ranks). Where several share it, overlapped calls enqueue their stream work each time instead of
  // replaying recorded graphs (docs/design/transport.md, "Ranks that share a GPU").
  int ranks_on_device = 1;
  int cc_major = 0, cc_minor = 0;
  std::string gpu_name;
  std::string tuning_cache;  // kAuto's cache file on top of the built-in one; empty: none
  std::function<void()> on_overdue;  // CommunicatorOptions::on_overdue

  Team lsa;
  cublasLtHandle_t cublaslt = nullptr;
  cudaStream_t setup_stream = nullptr;   // for the library's own blocking set-up work
  // One call at a time: the ops and barrier() hold it for their host part, so that calls from several
  // threads run one after another (each rank must still make its calls in the same order).
  std::mutex call_mutex;
  // The last uncaptured call's stream and its end, which a call on another stream waits for: the
  // calls share scratch, workspace, flags and events, so they must also run one after another on the
  // GPU (OrderedCall). Empty before the first such call: nullptr is the legacy default stream.
  std::optional<cudaStream_t> last_stream;
  cudaEvent_t last_end = nullptr;       // where that call's end is recorded: the watchdog's event, or
  cudaEvent_t last_call_end = nullptr;  // this one where the watchdog is off (one record per call)
  detail::DeviceFault* fault = nullptr;  // where this process's kernels report a timeout
  // Ends a call that runs on the GPU past 1.5 times the timeout (comm/watchdog.h); null with
  // ASYNCTP_WATCHDOG=off. OrderedCall brackets every uncaptured call for it.
  std::unique_ptr<comm::Watchdog> watchdog;

  std::unique_ptr<SignalPad> signals;
  std::unique_ptr<SignalPad> barrier_pad;  // flag p on rank q: the last barrier epoch rank p reached
  uint32_t* barrier_epoch = nullptr;       // this rank's barrier count, on the GPU (graph replays)
  std::unique_ptr<SymmetricBuffer> workspace;

  std::unique_ptr<HostMailbox> mailbox;  // argument checks on one node (else the transport's exchange)
  uint64_t check_seq = 0;                // argument checks made so far
  void* scratch = nullptr;            // ordinary device memory for the algorithms' local buffers
  size_t scratch_bytes = 0;
  // Once a call has been captured in a CUDA graph, the graph may replay at any time with the pointers
  // it was captured with: what a growth outgrows is then kept here until the communicator goes, not
  // freed (docs/design/architecture.md, "Who owns which memory").
  bool graphs_captured = false;
  std::vector<void*> retired_scratch;
  std::vector<std::unique_ptr<SymmetricBuffer>> retired_buffers;  // the same on every rank, in order
  // Keeps `buffer` alive where a captured graph may use it, else frees it (collective).
  void retire(std::unique_ptr<SymmetricBuffer> buffer);
  std::vector<const SymmetricBuffer*> symmetric_buffers;  // every live buffer made on this communicator
  uint64_t symmetric_buffers_made = 0;                    // SymmetricBuffer::serial of the last one made
  bool check_nonfinite = false;  // ASYNCTP_CHECK_NAN=1: scan the ops' inputs first (ops/nonfinite.h)

  // What the layers above keep here (comm/attachment.h), in the order they were made, each under its
  // type's tag; `attached` finds or makes one.
  std::vector<std::pair<const void*, std::unique_ptr<comm::Attachment>>> attachments;
  template <typename T, typename Make>
  T& attached(Make make) {
    if (T* found = find_attached<T>()) return *found;
    std::unique_ptr<T> made = make();
    T& ref = *made;
    attachments.emplace_back(comm::attachment_tag<T>(), std::move(made));
    return ref;
  }
  // The attachment of type T, or null where none was made.
  template <typename T>
  T* find_attached() const {
    for (const auto& [tag, a] : attachments) {
      if (tag == comm::attachment_tag<T>()) return static_cast<T*>(a.get());
    }
    return nullptr;
  }

  // Why this communicator may no longer be used, or empty while it is healthy. Set when a wait on the
  // peers gave up: the ranks are then out of step (or NCCL was aborted), so any later collective could
  // pair calls that do not belong together. Every later op, barrier and workspace call throws with it.
  std::string broken;

  // Throws an Error naming `what` and quoting `broken` when the communicator is broken.
  void require_usable(const char* what) const;
  // What abandon() does with the transport. kAbort: nothing of the transport's is running (the ranks
  // fell out of step on the host, or a kernel trapped), so it is stopped. kLeave: a kernel of the
  // transport's (NCCL's) may still wait on a peer that is gone; ncclCommAbort was seen to block for
  // good then (and to keep the process from exiting), so NCCL is left for the process's end to reclaim.
  enum class TransportFate { kAbort, kLeave };
  // Records `why` as the reason the communicator is broken (the first reason stays) and settles the
  // transport as `fate` says. Returns what became of it, as a clause for an error message; "" if
  // already broken.
  std::string abandon(const std::string& why, TransportFate fate);
  // Waits until `stream` has finished, at most `timeout_ms`. A kernel that trapped (one of asynctp's
  // bounded waits gave up) raises its report. NCCL's kernels have no bound of their own, so when the
  // time passes, or the transport reports an asynchronous error, the communicator is abandoned and an
  // Error naming `what` is thrown.
  void wait_bounded(cudaStream_t stream, int64_t timeout_ms, const char* what);
  // Communicator::barrier's work on `stream`, for a caller that holds the call already (an op).
  void enqueue_barrier(cudaStream_t stream);

  // The live SymmetricBuffer that holds all of [p, p + bytes) on this rank, or null.
  const SymmetricBuffer* find_symmetric(const void* p, size_t bytes) const;

  // At least `bytes` of scratch for work on `stream`; grows when needed (stream-ordered, so the device
  // is not drained: other ranks' kernels on a shared GPU may wait for this rank's next work), so not
  // during graph capture.
  void* scratch_for(size_t bytes, cudaStream_t stream);
  // The communicator's workspace of at least `bytes`, for a call on `stream`: as
  // Communicator::workspace, but a growth while `stream` is being captured is refused (every rank
  // needs the same growth at the same call, so every rank refuses it alike).
  SymmetricBuffer& workspace_for(Communicator& comm, size_t bytes, cudaStream_t stream);
  // Held for one call `what` on `stream`: serialises it with other threads' calls, refuses it where the
  // communicator can no longer be used (before anything touches the stream: after a device fault every
  // CUDA call fails), and orders it on the GPU after the last call where that was on another stream
  // (not under capture: a captured call runs when its graph is launched, ordered by the stream the
  // caller launches it on).
  class OrderedCall {
   public:
    OrderedCall(Impl& m, cudaStream_t stream, const char* what);
    ~OrderedCall();
    OrderedCall(const OrderedCall&) = delete;
    OrderedCall& operator=(const OrderedCall&) = delete;
    bool captured() const { return captured_; }  // whether `stream` is being captured

   private:
    Impl& m_;
    std::lock_guard<std::mutex> lock_;
    cudaStream_t stream_;
    const char* what_;
    bool captured_ = false;
    int watched_ = -1;  // the watchdog's slot for this call, or -1
  };

  // Refuses, while `stream` is being captured, a growth of `what` (scratch, workspace, inbox) from
  // `held` to `needed` bytes: one message for every such growth.
  static void refuse_growth_under_capture(cudaStream_t stream, const char* what, size_t needed, size_t held);

  // Where the ranks are threads of one process, before a GEMM's first launch (algo/resources.h sets it
  // as the GEMM runner's hook): every
  // rank reaches this point (Transport::settle), drains its GPU (whatever a rank queued before it
  // waits only for work every rank queued before it too), and settles again, so that the launch, which
  // may load a cuBLAS kernel and wait for every GPU of the process, finds them idle. Collective: the
  // ranks run the same GEMMs in the same order, having agreed on the op's arguments before its first
  // GEMM (ops.cc, agree).
  void quiesce(const char* what);

  // The transport's exchange (every rank's `mine`, by rank; collective, host-synchronous). A rank that
  // gives up breaks the communicator: the ranks are out of step from then on.
  std::vector<std::string> exchange(const std::string& mine, const char* what);

  // Every rank's `mine` (at most 31 bytes), by rank. Collective and host-synchronous.
  std::vector<std::string> allgather_short(const std::string& mine);

  // Ranks (world) whose `local_ok` was false; empty when all were fine. Collective and host-synchronous.
  std::vector<int> failing_ranks(bool local_ok);
};

// Lowest level of every wait: the values a kernel's WaitContext carries.
uint64_t timeout_ns(const Communicator& comm);

namespace detail {
struct CommunicatorAccess {
  static Communicator::Impl& of(Communicator& comm) { return *comm.impl_; }
  static const Communicator::Impl& of(const Communicator& comm) { return *comm.impl_; }
};
}  // namespace detail

// What `comm` holds; for the library's own algorithms, kernels, tools and tests only.
inline Communicator::Impl& impl_of(Communicator& comm) { return detail::CommunicatorAccess::of(comm); }
inline const Communicator::Impl& impl_of(const Communicator& comm) { return detail::CommunicatorAccess::of(comm); }

}  // namespace asynctp
