// Internal: what the overlapped algorithms (pipelined and fused) keep per communicator, made by the
// first such call: side streams, a pool of events, a pad of cross-rank flags, the epoch those flags
// carry, the symmetric inbox the fused ops' peers push into, and the fused reduce-scatter's counters.
//
// The flag protocol (docs/design/pipelined.md and docs/design/fused_all_gather_matmul.md tell it in full):
//  - every pipelined or fused call advances a device-resident epoch E; ranks advance theirs in step
//    because the ops are collective (and a communicator's calls are ordered on the GPU);
//  - a rank tells a peer "ready" or "done" by a copy-engine copy of its epoch word into the peer's flag,
//    so a signal behind a copy needs no SM and reads the epoch when it runs (CUDA graph replays carry
//    on counting);
//  - a wait is a one-warp kernel that spins with acquire loads, bounded by the communicator's timeout;
//    it is placed at the head of its stream so that it is resident before the GEMMs fill the GPU.
// Flag indices in the pad (one pad per rank):
//   done(p)        peer p is finished with the call that carried epoch E: it no longer reads this
//                  rank's buffers, nor reads its own buffers that this rank writes into;
//   ready(p, j)    chunk j of what peer p offers this rank is in place (pipelined: peers pull);
//   arrived(p, j)  chunk j from peer p has landed in this rank's inbox (fused: peers push; the fused
//                  GEMM waits on these flags itself);
//   pushed(p, j)   not a flag but a count: tiles of chunk j that peer p's fused reduce-scatter kernel
//                  has stored into this rank's inbox itself (kernels/fused/reduce_scatter_tiles.h,
//                  push_inbox); zero between calls.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "algo/stream_replay.h"
#include "asynctp/communicator.h"
#include "asynctp/ops.h"
#include "asynctp/signal.h"
#include "asynctp/symmetric.h"
#include "kernels/fused/done_signal.h"
#include "kernels/fused/chunk_slots.h"
#include "kernels/wait_context.h"

namespace asynctp::algo {

// The kernels index their flag and counter slots by chunk with a stride of their own.
static_assert(kernels::fused::kChunkSlots == kMaxChunksPerRank, "the kernels' slots per rank must match kMaxChunksPerRank");

class OverlapResources {
 public:
  // The communicator's resources, made on first use (collective). Refused while `stream` is being
  // captured into a CUDA graph: the first pipelined or fused call must run outside capture.
  static OverlapResources& of(Communicator& comm, cudaStream_t stream);
  ~OverlapResources();
  OverlapResources(const OverlapResources&) = delete;
  OverlapResources& operator=(const OverlapResources&) = delete;

  static int done_flag(int peer) { return peer; }
  int ready_flag(int peer, int chunk) const { return lsa_size_ + peer * kMaxChunksPerRank + chunk; }
  int arrived_flag(int peer, int chunk) const { return lsa_size_ * (1 + kMaxChunksPerRank) + peer * kMaxChunksPerRank + chunk; }
  int pushed_count(int peer, int chunk) const { return lsa_size_ * (1 + 2 * kMaxChunksPerRank) + peer * kMaxChunksPerRank + chunk; }
  static constexpr int kPadWordsPerPeer = 1 + 3 * kMaxChunksPerRank;
  // This rank's pad and epoch, for kernels that wait on flags themselves; `peer`'s pad, for kernels
  // that raise its flags or counts themselves.
  uint32_t* pad() const;
  uint32_t* pad_of(int peer) const;
  const uint32_t* epoch() const { return epoch_; }
  kernels::WaitContext wait_context() const;

  // Fused ops: the symmetric buffer peers push into (all_gather_matmul: their shards, at their rows of
  // the gathered A; matmul_reduce_scatter: their partial sums of this rank's rows), at least `bytes`.
  // Collective; grows (after draining the GPU) when a call needs more, so not during graph capture.
  SymmetricBuffer& inbox(size_t bytes, cudaStream_t stream);

  // Fused matmul_reduce_scatter: counters in this GPU's memory, one per (peer, chunk), that the kernel
  // raises as it stages that peer's tiles (kernels/fused/reduce_scatter_tiles.h).
  uint32_t* staged() const { return staged_; }
  // Fused ops: for the kernel to raise this rank's done flag at every peer as it ends
  // (kernels/fused/done_signal.h); its count of finished warps is zeroed with the staged counters.
  // In device memory; null where the team is too large, and the host must signal.
  const kernels::fused::DoneSignal* done_signal() const { return done_signal_; }
  // Stream-ordered, without an SM: `stream` waits until staged counter (peer, chunk) >= count. Unbounded
  // by itself: the counter is raised by this rank's own kernel, whose staged tiles wait for nothing.
  void wait_staged(cudaStream_t stream, int peer, int chunk, uint32_t count);

  // Streams of this communicator. peer_stream(p) moves data to or from peer p (pipelined pulls, fused
  // pushes). It and the signal stream run at the device's highest priority so that a wait kernel at
  // their head is placed before a GEMM's thread blocks. Where ranks share the GPU, every peer has one
  // stream and every GEMM lane another: the ranks' streams would otherwise outnumber the GPU's
  // hardware queues, and two ranks' streams on one queue can wait on each other
  // (docs/design/transport.md). That only orders more work: no pull or push waits for a later one
  // (the peers' partial GEMMs and staged tiles wait for no pull or push).
  cudaStream_t signal_stream() const { return signal_; }
  cudaStream_t peer_stream(int peer) const { return peer_streams_[peer_streams_.size() == 1 ? 0 : peer]; }
  cudaStream_t gemm_stream(int lane) const { return gemms_[ranks_share_device_ ? 0 : lane]; }
  static constexpr int kGemmStreams = 2;

  // Work sequences replayed from CUDA graphs (stream_replay.h): the fused reduce-scatter's pushes, and
  // pipelined calls (enqueue_call).
  StreamReplay& replays() { return replays_; }
  const StreamReplay& replays() const { return replays_; }
  // True where ranks share this GPU: stream work that could be replayed from a recorded graph is then
  // enqueued each call instead. Making a graph executable (cudaGraphUpload) waited for the GPU, where a
  // peer's wait that only this rank's next work ends was queued.
  bool replays_off() const { return ranks_share_device_; }
  // Whether another rank of the communicator runs on this GPU (the in-process transport).
  bool ranks_share_device() const { return ranks_share_device_; }
  // Enqueues a pipelined call's stream work, `enqueue(origin)`, on `stream`: by calling it under CUDA
  // graph capture, the first time for `key`, where replays_off() or with ASYNCTP_PIPELINED_EAGER=1;
  // else by launching the graph recorded from it, one API call instead of dozens
  // (StreamReplay::prepare_on_repeat). The work must depend on nothing `key` does not hold, and advance
  // the epoch once (begin_epoch): a replay does so on the device, and this advances the host's mirror.
  void enqueue_call(const StreamReplay::Key& key, cudaStream_t stream, const StreamReplay::Enqueue& enqueue);
  // Pipelined calls so far that were launched as a replay: what the tests check.
  uint64_t replayed_calls() const { return replayed_calls_; }
  // Fused reduce-scatter calls on two or more ranks so far that reduced in the epilogue, or in
  // fixup() (reduce_scatter_tiles.h): what the tests that force one way check it took.
  // Of those in the epilogue, how many the kernel pushed itself (reduce_scatter_tiles.h, push_inbox).
  void count_fused_reduction(bool in_epilogue, bool pushed_from_kernel) {
    ++fused_reductions_[in_epilogue ? 1 : 0];
    if (pushed_from_kernel) ++kernel_pushes_;
  }
  uint64_t fused_reductions(bool in_epilogue) const { return fused_reductions_[in_epilogue ? 1 : 0]; }
  uint64_t kernel_pushes() const { return kernel_pushes_; }
  // Fused all-gather calls on two or more ranks so far whose kernels ran (no cuBLASLt fallback): what
  // the tests that expect the kernel check.
  void count_fused_gather() { ++fused_gathers_; }
  uint64_t fused_gathers() const { return fused_gathers_; }
  // Whether `stream` is being captured into a CUDA graph now.
  static bool capturing(cudaStream_t stream);

  // Starts a call: events are handed out afresh from the pool.
  void begin_call() {
    next_event_ = 0;
    mid_protocol_ = false;
  }
  // Whether the current call's epoch has begun and its protocol is not complete: its peers then wait
  // on flags that a throw from here on would leave unraised (ops/dispatch.cc then breaks the
  // communicator). end_call() says the call has enqueued all it owes its peers.
  bool mid_protocol() const { return mid_protocol_; }
  void end_call() { mid_protocol_ = false; }
  // For the tests: the next call's epoch begins, then the call throws an Error saying `why`.
  void fail_after_next_epoch(std::string why) { injected_failure_ = std::move(why); }
  // For the tests: as though the calls so far had reached `epoch` (near 2^32, to cross the wrap):
  // this rank's epoch and every flag of its pad that holds an epoch (done, ready, arrived; the pushed
  // counts stay zero) become `epoch`. Every rank must do it with no call in flight (the device is
  // drained here), and none may make its next call before all have (the caller's barrier).
  void set_epoch_for_tests(uint32_t epoch);
  // An event recorded on `from` now.
  cudaEvent_t record(cudaStream_t from);
  // Work enqueued on `to` from now on runs after everything enqueued so far on `from`.
  void follow(cudaStream_t to, cudaStream_t from);
  void follow(cudaStream_t to, cudaEvent_t event);

  // Stream-ordered: waits (bounded) until every peer's done flag has reached the current epoch (skipped
  // where `wait_done` is false), then advances the epoch. Goes first in a call, on the caller's stream.
  void begin_epoch(cudaStream_t stream, bool wait_done) {
    launch_done_kernel(stream, wait_done, /*advance=*/true, /*reset_staged=*/false, capturing(stream));
  }
  // begin_epoch for a fused call, which pushes into its peers' buffers and so must know they are done
  // with the last call; `capturing_now`: whether `stream` is under capture (the caller has asked).
  // Outside CUDA graph capture the host mirrors the device epoch, so a side stream can wait for the
  // peers' done with a stream memory operation (wait_previous_done_without_sm), which needs no SM and
  // so can wait beside a GEMM that fills the GPU; this returns true and does not wait. Once any call on
  // this communicator has been captured the host no longer knows the epoch a replay runs with: this
  // returns false from then on, and waits itself. Either way it zeroes the staged counters and the done
  // signal's count in the same launch (a fused call starts with an idle GPU as often as not, and each
  // API call before its kernel delays the kernel).
  bool begin_fused_epoch(cudaStream_t stream, bool capturing_now) {
    const bool knows = knows_epoch(capturing_now);
    launch_done_kernel(stream, /*wait=*/!knows, /*advance=*/true, /*reset_staged=*/true, capturing_now);
    return knows;
  }
  // For a fused call whose kernel starts the epoch itself (the reduce-scatter: begin_epoch in
  // kernels/fused/reduce_scatter_tiles.h), which saves the launch of a kernel before it: where the host
  // knows the epoch, advances it on the host and returns the call's epoch, which the kernel stores to
  // epoch_word(); else (a call has been captured, or the count wraps to 0) returns 0, and the call
  // must use begin_fused_epoch. It relies on what every fused call leaves behind: the staged counters
  // zeroed by the pushes (zero_staged) and the done signal's count by the kernel's last warp.
  uint32_t begin_epoch_in_kernel(bool capturing_now) {
    if (!knows_epoch(capturing_now) || host_epoch_ + 1 == 0) return 0;
    epoch_begun();
    return ++host_epoch_;
  }
  uint32_t* epoch_word() const { return epoch_; }
  // Stream-ordered: zeroes the staged counters of `peer`'s rows, after the pushes that waited on them.
  void zero_staged(cudaStream_t stream, int peer, int chunks);

  // Stream-ordered: waits (bounded) until every peer's done flag has reached the current epoch.
  void wait_done(cudaStream_t stream) {
    launch_done_kernel(stream, /*wait=*/true, /*advance=*/false, /*reset_staged=*/false, /*capturing_now=*/false);
  }

  // After begin_fused_epoch, where it returned true: `stream` waits until every peer's done flag shows it
  // has finished the previous call. Unbounded by itself; used only where a bounded wait of the same
  // call depends on what follows it (docs/design/fused_all_gather_matmul.md).
  void wait_previous_done_without_sm(cudaStream_t stream);
  // Flags of this rank's pad, each with the peer that sets it (named in a timeout report).
  struct FlagList {
    static constexpr int kMax = 8 * kMaxChunksPerRank;
    int count = 0;
    int flag[kMax];
    int owner[kMax];
    void add(int f, int o);
  };
  // Stream-ordered: waits (bounded) until each listed flag has reached the current epoch, in order.
  void wait_ready(cudaStream_t stream, const FlagList& flags);
  // Stream-ordered, after earlier work on `stream`: flag `flag` of `peer`'s pad := the current epoch.
  void signal(cudaStream_t stream, int peer, int flag);

 private:
  explicit OverlapResources(Communicator& comm);
  // The call's epoch has begun (mid_protocol), and the test hook's failure, if any, is thrown.
  void epoch_begun();
  void launch_done_kernel(cudaStream_t stream, bool wait, bool advance, bool reset_staged, bool capturing_now);
  // Whether the host still knows the device epoch: not once a call has been captured (a replay runs
  // with whatever epoch the device holds then).
  bool knows_epoch(bool capturing_now) {
    if (capturing_now) host_knows_epoch_ = false;
    return host_knows_epoch_;
  }
  Communicator& comm_;
  int lsa_size_ = 0;
  std::unique_ptr<SignalPad> pad_;
  std::unique_ptr<SymmetricBuffer> inbox_;
  uint32_t* staged_ = nullptr;
  kernels::fused::DoneSignal* done_signal_ = nullptr;
  // The staged counters, then the done signal's count of finished warps.
  kernels::fused::StagedCounters counters() const { return kernels::fused::StagedCounters{lsa_size_}; }
  size_t staged_bytes() const { return static_cast<size_t>(counters().words()) * sizeof(uint32_t); }
  uint32_t* epoch_ = nullptr;  // device: the epoch of the current (or last) overlapped call
  uint32_t host_epoch_ = 0;    // the same, as the host knows it while host_knows_epoch_
  // False for good once a call has been captured (begin_fused_epoch).
  bool host_knows_epoch_ = true;
  bool mid_protocol_ = false;
  std::string injected_failure_;
  cudaStream_t signal_ = nullptr;
  std::vector<cudaStream_t> peer_streams_;
  cudaStream_t gemms_[kGemmStreams] = {};
  std::vector<cudaEvent_t> events_;
  size_t next_event_ = 0;
  StreamReplay replays_;
  bool eager_calls_ = false;  // ASYNCTP_PIPELINED_EAGER, or ranks_share_device_
  bool ranks_share_device_ = false;
  // True while enqueue_call records a replay: its capture must not cost the host its epoch.
  bool recording_ = false;
  uint64_t replayed_calls_ = 0;
  uint64_t fused_reductions_[2] = {};
  uint64_t kernel_pushes_ = 0;
  uint64_t fused_gathers_ = 0;
};

// Fans a call out from the caller's stream onto side streams and joins them back: a side stream waits
// for the fork the first time it is used, and join() makes the caller's stream wait for every side
// stream used. Under CUDA graph capture that is what brings the side streams into the graph.
class Fanout {
 public:
  Fanout(OverlapResources& pr, cudaStream_t origin) : pr_(pr), origin_(origin), fork_(pr.record(origin)) {}
  cudaStream_t use(cudaStream_t side) {
    for (cudaStream_t s : used_) {
      if (s == side) return side;
    }
    pr_.follow(side, fork_);
    used_.push_back(side);
    return side;
  }
  void join() {
    for (cudaStream_t s : used_) pr_.follow(origin_, s);
  }

 private:
  OverlapResources& pr_;
  cudaStream_t origin_;
  cudaEvent_t fork_;
  std::vector<cudaStream_t> used_;
};

}  // namespace asynctp::algo
