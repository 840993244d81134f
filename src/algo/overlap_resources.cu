#include "algo/overlap_resources.h"

#include <algorithm>
#include <vector>

#include "algo/resources.h"
#include "comm/communicator_impl.h"
#include "common/check.h"
#include "common/driver_api.h"
#include "common/env.h"
#include "kernels/signal.cuh"

namespace asynctp::algo {
namespace {

// One warp: lane p waits for peer p's done flag (skipping this rank), then lane 0 advances the epoch.
__global__ void __launch_bounds__(32) begin_epoch_kernel(const uint32_t* pad, uint32_t* epoch, int lsa_size, int me,
                                                         bool wait_done, bool advance, uint32_t* zero, int zero_words,
                                                         kernels::WaitContext ctx) {
  for (int i = threadIdx.x; i < zero_words; i += 32) zero[i] = 0;
  const uint32_t current = *epoch;
  for (int p = threadIdx.x; wait_done && p < lsa_size; p += 32) {
    if (p != me) kernels::wait_flag_sys(pad + p, current, p, p, ctx);  // done_flag(p) == p
  }
  __syncwarp();
  if (advance && threadIdx.x == 0) *epoch = current + 1;
}

__global__ void __launch_bounds__(32) wait_ready_kernel(const uint32_t* pad, const uint32_t* epoch,
                                                        OverlapResources::FlagList list, kernels::WaitContext ctx) {
  if (threadIdx.x != 0) return;
  const uint32_t current = *epoch;
  for (int i = 0; i < list.count; ++i) kernels::wait_flag_sys(pad + list.flag[i], current, list.owner[i], list.flag[i], ctx);
}

}  // namespace

bool OverlapResources::capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  ASYNCTP_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  return capture != cudaStreamCaptureStatusNone;
}

void OverlapResources::FlagList::add(int f, int o) {
  ASYNCTP_CHECK(count < kMax, "overlapped op: more than ", kMax, " flags in one wait");
  flag[count] = f;
  owner[count] = o;
  ++count;
}

OverlapResources& OverlapResources::of(Communicator& comm, cudaStream_t stream) {
  Resources& r = Resources::of(comm);
  if (!r.overlap) {
    ASYNCTP_CHECK(!capturing(stream),
                  "pipelined/fused: the first pipelined or fused call on a communicator sets up streams, flags and "
                  "memory, which cannot happen while a CUDA graph is being captured; make one call before capturing");
    r.overlap.reset(new OverlapResources(comm));
  }
  return *r.overlap;
}

OverlapResources::OverlapResources(Communicator& comm) : comm_(comm) {
  Communicator::Impl& m = impl_of(comm);
  lsa_size_ = m.lsa.size;
  pad_ = SignalPad::create(comm, lsa_size_ * kPadWordsPerPeer);
  ASYNCTP_CUDA_CHECK(cudaMalloc(&epoch_, sizeof(uint32_t)));
  ASYNCTP_CUDA_CHECK(cudaMemsetAsync(epoch_, 0, sizeof(uint32_t), m.setup_stream));
  ASYNCTP_CUDA_CHECK(cudaMalloc(&staged_, staged_bytes()));
  ASYNCTP_CUDA_CHECK(cudaMemsetAsync(staged_, 0, staged_bytes(), m.setup_stream));
  int least = 0, greatest = 0;
  ASYNCTP_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  ranks_share_device_ = m.ranks_on_device > 1;
  ASYNCTP_CUDA_CHECK(cudaStreamCreateWithPriority(&signal_, cudaStreamNonBlocking, greatest));
  peer_streams_.resize(ranks_share_device_ ? 1 : lsa_size_);
  for (cudaStream_t& s : peer_streams_) ASYNCTP_CUDA_CHECK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, greatest));
  for (int lane = 0; lane < (ranks_share_device_ ? 1 : kGemmStreams); ++lane) {
    ASYNCTP_CUDA_CHECK(cudaStreamCreateWithPriority(&gemms_[lane], cudaStreamNonBlocking, least));
  }
  // Enough for the largest call: a fork, joins, and an event per chunk per peer for each of two kinds.
  events_.resize(8 + 4 * static_cast<size_t>(lsa_size_) * (kMaxChunksPerRank + 1));
  for (cudaEvent_t& e : events_) ASYNCTP_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  // What a fused kernel needs to raise this rank's done flag at its peers, in device memory.
  if (lsa_size_ - 1 <= kernels::fused::kMaxDonePeers) {
    kernels::fused::DoneSignal d;
    for (int p = 0; p < lsa_size_; ++p) {
      if (p != m.lsa.rank) d.flag[d.peers++] = pad_->peer(p) + done_flag(m.lsa.rank);
    }
    d.finished = staged_ + counters().finished_warps();
    d.epoch = epoch_;
    ASYNCTP_CUDA_CHECK(cudaMalloc(&done_signal_, sizeof(d)));
    ASYNCTP_CUDA_CHECK(cudaMemcpy(done_signal_, &d, sizeof(d), cudaMemcpyHostToDevice));
  }
  Resources::of(comm).gemm.reserve();
  eager_calls_ = ranks_share_device_ || detail::knob_flag(detail::Knob::kPipelinedEager);
  // Loads the small kernels now: CUDA loads a kernel at its first launch, and a load can wait for the
  // device to go idle, which a fused kernel spinning on a flag that a peer sets only later would not.
  cudaFuncAttributes attributes;
  ASYNCTP_CUDA_CHECK(cudaFuncGetAttributes(&attributes, begin_epoch_kernel));
  ASYNCTP_CUDA_CHECK(cudaFuncGetAttributes(&attributes, wait_ready_kernel));
  // Where ranks share the GPU, what a fused call would make at its first use is made here, and no rank
  // leaves before every rank has made it all (Transport::settle).
  if (ranks_share_device_) Resources::of(comm).tail_split_workspace(m.setup_stream);
  ASYNCTP_CUDA_CHECK(cudaStreamSynchronize(m.setup_stream));
  m.transport->settle("overlapped-call set-up");
}

kernels::WaitContext OverlapResources::wait_context() const {
  return kernels::WaitContext{impl_of(comm_).fault, timeout_ns(comm_), comm_.rank()};
}

uint32_t* OverlapResources::pad() const { return pad_->local(); }

uint32_t* OverlapResources::pad_of(int peer) const { return pad_->peer(peer); }

SymmetricBuffer& OverlapResources::inbox(size_t bytes, cudaStream_t stream) {
  if (!inbox_ || inbox_->size() < bytes) {
    Communicator::Impl::refuse_growth_under_capture(stream, "fused inbox (symmetric memory peers push into)", bytes,
                                                    inbox_ ? inbox_->size() : 0);
    impl_of(comm_).retire(std::move(inbox_));  // freed (collective: drains the GPU first) or kept for graphs
    inbox_ = SymmetricBuffer::create(comm_, bytes);
  }
  return *inbox_;
}

OverlapResources::~OverlapResources() {
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
  for (cudaStream_t s : gemms_) {
    if (s != nullptr) cudaStreamDestroy(s);
  }
  for (cudaStream_t s : peer_streams_) cudaStreamDestroy(s);
  cudaStreamDestroy(signal_);
  cudaFree(epoch_);
  cudaFree(staged_);
  cudaFree(done_signal_);
}

void OverlapResources::wait_staged(cudaStream_t stream, int peer, int chunk, uint32_t count) {
  ASYNCTP_CU_CHECK(detail::driver().stream_wait_value32(
      reinterpret_cast<CUstream>(stream), reinterpret_cast<CUdeviceptr>(staged_ + counters().of(peer, chunk)),
      count, CU_STREAM_WAIT_VALUE_GEQ));
}

cudaEvent_t OverlapResources::record(cudaStream_t from) {
  ASYNCTP_CHECK(next_event_ < events_.size(), "overlapped op: more than ", events_.size(), " events in one call");
  cudaEvent_t e = events_[next_event_++];
  ASYNCTP_CUDA_CHECK(cudaEventRecord(e, from));
  return e;
}

void OverlapResources::follow(cudaStream_t to, cudaEvent_t event) {
  ASYNCTP_CUDA_CHECK(cudaStreamWaitEvent(to, event, 0));
}

void OverlapResources::follow(cudaStream_t to, cudaStream_t from) { follow(to, record(from)); }

void OverlapResources::wait_previous_done_without_sm(cudaStream_t stream) {
  ASYNCTP_CHECK(host_knows_epoch_, "overlapped op: the host does not know the epoch (a call was captured)");
  const int me = impl_of(comm_).lsa.rank;
  // One batch: each API call costs microseconds of the host's time, and these come right after the
  // kernel's launch, ahead of the pushes that the kernel's peers wait for.
  std::vector<CUstreamBatchMemOpParams> waits;
  for (int p = 0; p < lsa_size_; ++p) {
    if (p == me) continue;
    CUstreamBatchMemOpParams w{};
    w.waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_32;
    w.waitValue.address = reinterpret_cast<CUdeviceptr>(pad_->local() + done_flag(p));
    w.waitValue.value = host_epoch_ - 1;
    w.waitValue.flags = CU_STREAM_WAIT_VALUE_GEQ;
    waits.push_back(w);
  }
  if (waits.empty()) return;
  ASYNCTP_CU_CHECK(detail::driver().stream_batch_mem_op(reinterpret_cast<CUstream>(stream),
                                                        static_cast<unsigned int>(waits.size()), waits.data(), 0));
}

void OverlapResources::zero_staged(cudaStream_t stream, int peer, int chunks) {
  ASYNCTP_CUDA_CHECK(cudaMemsetAsync(staged_ + counters().of(peer, 0), 0,
                                     static_cast<size_t>(chunks) * sizeof(uint32_t), stream));
}

void OverlapResources::launch_done_kernel(cudaStream_t stream, bool wait, bool advance, bool reset_staged,
                                          bool capturing_now) {
  // A replay being recorded advances the host's epoch at each launch (enqueue_call), not here.
  const bool knows = !recording_ && knows_epoch(capturing_now);
  if (advance && knows) ++host_epoch_;
  const int zero_words = reset_staged ? static_cast<int>(staged_bytes() / sizeof(uint32_t)) : 0;
  begin_epoch_kernel<<<1, 32, 0, stream>>>(pad_->local(), epoch_, lsa_size_, impl_of(comm_).lsa.rank, wait, advance,
                                           staged_, zero_words, wait_context());
  if (advance) epoch_begun();
  ASYNCTP_CUDA_CHECK(cudaGetLastError());
}

void OverlapResources::set_epoch_for_tests(uint32_t epoch) {
  ASYNCTP_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<uint32_t> words(static_cast<size_t>(lsa_size_) * kPadWordsPerPeer, 0);
  std::fill(words.begin(), words.begin() + pushed_count(0, 0), epoch);
  ASYNCTP_CUDA_CHECK(cudaMemcpy(pad_->local(), words.data(), words.size() * sizeof(uint32_t), cudaMemcpyHostToDevice));
  ASYNCTP_CUDA_CHECK(cudaMemcpy(epoch_, &epoch, sizeof(epoch), cudaMemcpyHostToDevice));
  host_epoch_ = epoch;
}

void OverlapResources::epoch_begun() {
  mid_protocol_ = true;
  if (!injected_failure_.empty()) {
    std::string why;
    why.swap(injected_failure_);
    throw Error(why);
  }
}

void OverlapResources::enqueue_call(const StreamReplay::Key& key, cudaStream_t stream,
                                    const StreamReplay::Enqueue& enqueue) {
  if (eager_calls_ || capturing(stream)) {
    enqueue(stream);
    return;
  }
  recording_ = true;
  cudaGraphExec_t replay = nullptr;
  try {
    replay = replays_.prepare_on_repeat(key, stream, enqueue);
  } catch (...) {
    recording_ = false;
    throw;
  }
  recording_ = false;
  if (replay == nullptr) {
    enqueue(stream);
    return;
  }
  mid_protocol_ = true;  // the replay begins the epoch on the device
  StreamReplay::launch(replay, stream);
  if (host_knows_epoch_) ++host_epoch_;
  ++replayed_calls_;
}

void OverlapResources::wait_ready(cudaStream_t stream, const FlagList& flags) {
  wait_ready_kernel<<<1, 32, 0, stream>>>(pad_->local(), epoch_, flags, wait_context());
  ASYNCTP_CUDA_CHECK(cudaGetLastError());
}

void OverlapResources::signal(cudaStream_t stream, int peer, int flag) {
  // A 4-byte copy-engine copy: it starts after earlier work on `stream` has finished (so the data it
  // announces is in place) and reads the epoch when it runs, not when it was enqueued.
  ASYNCTP_CUDA_CHECK(cudaMemcpyAsync(pad_->peer(peer) + flag, epoch_, sizeof(uint32_t), cudaMemcpyDeviceToDevice,
                                     stream));
}

}  // namespace asynctp::algo
