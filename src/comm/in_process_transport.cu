#include "comm/in_process_transport.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "comm/barrier.h"
#include "comm/in_process_group.h"
#include "common/check.h"
#include "common/element.h"
#include "kernels/sum_partials.h"

namespace asynctp::comm {
namespace {

// Symmetric allocations are rounded up to this, as NCCL's windows are (NCCL_WIN_REQUIRED_ALIGNMENT).
constexpr size_t kAlignment = 4096;
// Each rank's block in the reduce-scatter's staging starts on this boundary (the sum kernel's loads
// are 16 bytes wide).
constexpr size_t kBlockAlignment = 256;

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  ASYNCTP_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  return status != cudaStreamCaptureStatusNone;
}

class InProcessTransport final : public Transport {
 public:
  InProcessTransport(std::shared_ptr<InProcessGroup> group, int rank, int timeout_ms, const kernels::WaitContext& ctx)
      : group_(std::move(group)), rank_(rank), timeout_ms_(timeout_ms), ctx_(ctx) {
    device_ = group_->device_of(rank_);
    ASYNCTP_CUDA_CHECK(cudaSetDevice(device_));
    enable_peer_access();
    keep_pool_reuse_within_streams();
    ASYNCTP_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    barrier_pad_ = map_symmetric(sizeof(uint32_t) * static_cast<size_t>(world_size()));
    ASYNCTP_CUDA_CHECK(cudaMalloc(&barrier_epoch_, sizeof(uint32_t)));
    ASYNCTP_CUDA_CHECK(cudaMemsetAsync(barrier_epoch_, 0, sizeof(uint32_t), stream_));
    ASYNCTP_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  // A transport that was never shut down belongs to a rank whose communicator was not made: the others
  // must not wait for it.
  ~InProcessTransport() override {
    if (!shut_down_) group_->abort(detail::cat("rank ", rank_, " gave up making its communicator"));
    if (stream_) cudaStreamDestroy(stream_);
  }

  const char* name() const override { return "in-process"; }
  int rank() const override { return rank_; }
  int world_size() const override { return group_->world_size(); }
  int device() const override { return device_; }
  Team lsa() const override { return Team{rank_, world_size()}; }
  int lsa_to_world(int lsa_rank) const override { return lsa_rank; }

  std::vector<std::string> exchange(const std::string& mine, const char* what) override {
    return impl_of(*group_).exchange(rank_, mine, timeout_ms_, what);
  }

  size_t alignment() const override { return kAlignment; }

  SymmetricMapping map_symmetric(size_t bytes) override {
    SymmetricMapping m;
    m.bytes = round_up(bytes, kAlignment);
    ASYNCTP_CUDA_CHECK(cudaSetDevice(device_));
    ASYNCTP_CUDA_CHECK(cudaMalloc(&m.local, m.bytes));
    // Zeroed before the exchange below: no rank sees a peer's part before it is zero.
    ASYNCTP_CUDA_CHECK(cudaMemsetAsync(m.local, 0, m.bytes, stream_));
    ASYNCTP_CUDA_CHECK(cudaStreamSynchronize(stream_));
    std::string mine(sizeof(void*), '\0');
    std::memcpy(mine.data(), &m.local, sizeof(void*));
    std::vector<std::string> all;
    try {
      all = exchange(mine, "symmetric allocation");
    } catch (...) {
      cudaFree(m.local);
      throw;
    }
    for (const std::string& p : all) {
      void* peer = nullptr;
      std::memcpy(&peer, p.data(), sizeof(void*));
      m.peers.push_back(peer);
    }
    ASYNCTP_CUDA_CHECK(cudaMalloc(&m.device_peers, sizeof(void*) * m.peers.size()));
    ASYNCTP_CUDA_CHECK(cudaMemcpyAsync(m.device_peers, m.peers.data(), sizeof(void*) * m.peers.size(),
                                       cudaMemcpyHostToDevice, stream_));
    ASYNCTP_CUDA_CHECK(cudaStreamSynchronize(stream_));
    settle("symmetric allocation");
    return m;
  }

  // Every rank of the group takes part, wherever it runs: a rank alone on its GPU that skipped it would
  // pair its next exchange with its peers' settle. On several GPUs of one process it is needed too
  // (Communicator::Impl::quiesce).
  void settle(const char* what) override { exchange(std::string(), what); }

  bool ranks_in_one_process() const override { return true; }

  void unmap_symmetric(SymmetricMapping& m) override {
    if (m.local) cudaFree(m.local);
    if (m.device_peers) cudaFree(m.device_peers);
    m = SymmetricMapping{};
  }

  void all_gather(const void* send, void* recv, size_t bytes, cudaStream_t stream) override {
    const SymmetricMapping& s = staging(bytes, stream, "all-gather");
    ASYNCTP_CUDA_CHECK(cudaMemcpyAsync(s.local, send, bytes, cudaMemcpyDefault, stream));
    barrier(stream);  // every rank's part is in its staging
    for (int q = 0; q < world_size(); ++q) {
      char* dst = static_cast<char*>(recv) + static_cast<size_t>(q) * bytes;
      const void* src = q == rank_ ? send : s.peers[static_cast<size_t>(q)];
      if (dst != src) ASYNCTP_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream));
    }
    barrier(stream);  // every rank has read this rank's staging: the next collective may overwrite it
  }

  void reduce_scatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                      cudaStream_t stream) override {
    ASYNCTP_CHECK(dtype == DType::kBF16 || dtype == DType::kFP16, "in-process reduce-scatter: dtype ",
                  dtype_name(dtype), " is not supported; expected bf16 or fp16");
    const int n = world_size();
    const size_t block = count * dtype_size(dtype);
    const size_t pitch = round_up(block, kBlockAlignment);
    const SymmetricMapping& s = staging(pitch * n, stream, "reduce-scatter");
    ASYNCTP_CUDA_CHECK(cudaMemcpy2DAsync(s.local, pitch, send, block, block, n, cudaMemcpyDefault, stream));
    barrier(stream);
    // Every rank's block for this rank, summed in fp32 in rank order (so the same bits on every run).
    std::vector<const void*> parts;
    for (int q = 0; q < n; ++q) parts.push_back(static_cast<const char*>(s.peers[static_cast<size_t>(q)]) + rank_ * pitch);
    const float scale = op == ReduceOp::kAvg ? 1.0f / static_cast<float>(n) : 1.0f;
    kernels::sum_partials(element_of(dtype), parts, recv, static_cast<int64_t>(count), scale, stream);
    barrier(stream);
  }

  std::string async_error() override {
    const std::string why = group_->aborted();
    return why.empty() ? std::string() : detail::cat("the in-process group was aborted: ", why);
  }

  std::string abandon(const std::string& why, bool) override {
    group_->abort(detail::with_rank(why));
    return "; the in-process group was aborted";
  }

  void shutdown(bool healthy) override {
    shut_down_ = true;
    if (!healthy) return;  // a kernel may still reach the memory: the process's end reclaims it
    unmap_symmetric(barrier_pad_);
    for (SymmetricMapping& s : stagings_) unmap_symmetric(s);
    stagings_.clear();
    cudaFree(barrier_epoch_);
    barrier_epoch_ = nullptr;
  }

 private:
  void enable_peer_access() {
    std::set<int> others;
    for (int r = 0; r < world_size(); ++r) {
      if (group_->device_of(r) != device_) others.insert(group_->device_of(r));
    }
    for (int peer : others) {
      int can = 0;
      ASYNCTP_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, device_, peer));
      ASYNCTP_CHECK(can, "in-process group: GPU ", device_, " has no P2P access to GPU ", peer,
                    "; the ranks of an in-process group must reach each other's memory");
      const cudaError_t e = cudaDeviceEnablePeerAccess(peer, 0);
      if (e == cudaErrorPeerAccessAlreadyEnabled) {
        (void)cudaGetLastError();
      } else {
        ASYNCTP_CUDA_CHECK(e);
      }
    }
  }

  // Stream-ordered allocations (the scratch, the ranks' own) come from the device's default pool, which
  // by default may hand one stream memory that another freed by making the first wait for the second.
  // Between ranks that is a wait the flag protocol does not know of, and it can close a cycle (a rank's
  // stream waits for a peer's, whose next op waits for this rank). Memory freed on another stream is
  // then reused only once the free has completed.
  void keep_pool_reuse_within_streams() {
    cudaMemPool_t pool = nullptr;
    ASYNCTP_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device_));
    int off = 0;
    ASYNCTP_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolReuseFollowEventDependencies, &off));
    ASYNCTP_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolReuseAllowInternalDependencies, &off));
  }

  void barrier(cudaStream_t stream) {
    enqueue_barrier(reinterpret_cast<uint32_t* const*>(barrier_pad_.device_peers), barrier_epoch_, rank_,
                    world_size(), ctx_, stream);
  }

  // The collectives' staging, at least `bytes` on every rank. Every rank asks for the same size at the
  // same collective, so all grow together. A staging that is outgrown stays allocated until the
  // transport goes: a peer's collective that reads it may still be queued.
  const SymmetricMapping& staging(size_t bytes, cudaStream_t stream, const char* what) {
    if (stagings_.empty() || stagings_.back().bytes < bytes) {
      ASYNCTP_CHECK(!capturing(stream), "in-process ", what, ": this call needs ", bytes, " bytes of staging and the ",
                    "transport holds ", stagings_.empty() ? 0 : stagings_.back().bytes, "; it cannot grow under CUDA ",
                    "graph capture: make one call of this size outside capture first");
      const size_t grown = stagings_.empty() ? 0 : stagings_.back().bytes;
      stagings_.push_back(map_symmetric(std::max(bytes, grown + grown / 2)));
    }
    return stagings_.back();
  }

  std::shared_ptr<InProcessGroup> group_;
  int rank_ = 0;
  int device_ = 0;
  int timeout_ms_ = 0;
  kernels::WaitContext ctx_;
  cudaStream_t stream_ = nullptr;  // set-up work
  SymmetricMapping barrier_pad_;
  uint32_t* barrier_epoch_ = nullptr;
  std::vector<SymmetricMapping> stagings_;
  bool shut_down_ = false;
};

}  // namespace

std::unique_ptr<Transport> make_in_process_transport(std::shared_ptr<InProcessGroup> group, int rank, int timeout_ms,
                                                     const kernels::WaitContext& ctx) {
  return std::make_unique<InProcessTransport>(std::move(group), rank, timeout_ms, ctx);
}

}  // namespace asynctp::comm
