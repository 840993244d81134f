#include "comm/nccl_transport.h"

#include <nccl_device.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <thread>

#include "comm/bounded_call.h"
#include "common/check.h"

namespace asynctp::comm {
namespace {

// LSA barriers NCCL reserves for kernels of its device API: one per CTA of a persistent kernel on a
// full H100/H200.
constexpr int kLsaBarrierCount = 132;
// The most bytes a rank contributes to one exchange (the ops' argument check: 128 int64).
constexpr size_t kExchangeBytes = 1024;
// How long abandon() waits for ncclCommAbort. It is only called where nothing of NCCL's should be
// running, but an abort that blocks anyway (one did, with an NCCL kernel waiting on a peer whose
// process was gone) must not turn an error into a hang.
constexpr int kAbortWaitMs = 5000;

// NCCL 2.28 has no host-side getter for peer addresses (2.29 adds ncclGetLsaDevicePointer), but the
// device API computes them from the window; read once here, they serve both kernels and the copy engine.
__global__ void read_lsa_pointers(ncclWindow_t window, int lsa_size, void** out) {
  for (int peer = threadIdx.x; peer < lsa_size; peer += blockDim.x) out[peer] = ncclGetLsaPointer(window, 0, peer);
}

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::kBF16: return ncclBfloat16;
    case DType::kFP16: return ncclFloat16;
    case DType::kFP32: return ncclFloat32;
    case DType::kFP8E4M3: return ncclFloat8e4m3;
    case DType::kFP8E5M2: return ncclFloat8e5m2;
  }
  return ncclFloat32;
}

class NcclTransport final : public Transport {
 public:
  NcclTransport(ncclComm_t comm, bool owns, BoundedWait wait, int setup_bound_ms)
      : comm_(comm), owns_(owns), wait_(std::move(wait)), setup_bound_ms_(setup_bound_ms) {
    ASYNCTP_NCCL_CHECK(ncclCommUserRank(comm, &rank_));
    ASYNCTP_NCCL_CHECK(ncclCommCount(comm, &world_size_));
    ASYNCTP_NCCL_CHECK(ncclCommCuDevice(comm, &device_));
    ASYNCTP_CUDA_CHECK(cudaSetDevice(device_));
    const ncclTeam_t team = ncclTeamLsa(comm);
    lsa_ = Team{team.rank, team.nRanks};
    for (int i = 0; i < team.nRanks; ++i) lsa_world_.push_back(ncclTeamRankToWorld(comm, team, i));
    // The split and the device communicator are collective: they wait for every rank, with a bound.
    check_comm_ = within_bound<ncclComm_t>(
        device_, rank_, setup_bound_ms_, "ncclCommSplit (the communicator of the host-side exchanges)",
        [comm = comm_, rank = rank_] {
          ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
          config.blocking = 1;
          ncclComm_t split = nullptr;
          ASYNCTP_NCCL_CHECK(ncclCommSplit(comm, 0, rank, &split, &config));
          return split;
        });
    ASYNCTP_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    ASYNCTP_CUDA_CHECK(cudaMalloc(&exchange_dev_, kExchangeBytes * static_cast<size_t>(world_size_)));
    ASYNCTP_CUDA_CHECK(cudaMallocHost(&exchange_host_, kExchangeBytes * static_cast<size_t>(world_size_ + 1)));

    dev_comm_ = within_bound<ncclDevComm>(device_, rank_, setup_bound_ms_, "ncclDevCommCreate", [comm = comm_] {
      ncclDevCommRequirements reqs;
      std::memset(&reqs, 0, sizeof reqs);
      reqs.lsaBarrierCount = kLsaBarrierCount;
      reqs.lsaMultimem = false;  // NVLink multicast stays off: it can take the host's GPUs out of service
      ncclDevComm made{};
      ASYNCTP_NCCL_CHECK(ncclDevCommCreate(comm, &reqs, &made));
      return made;
    });
    has_dev_comm_ = true;
  }

  // A transport that was never shut down (the communicator's set-up failed) aborts what it owns.
  ~NcclTransport() override {
    if (shut_down_) return;
    if (check_comm_ && !nccl_done_) ncclCommAbort(check_comm_);
    if (owns_ && !nccl_done_) ncclCommAbort(comm_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  const char* name() const override { return "nccl"; }
  bool collectives_unbounded() const override { return true; }
  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  int device() const override { return device_; }
  Team lsa() const override { return lsa_; }
  int lsa_to_world(int lsa_rank) const override { return lsa_world_[static_cast<size_t>(lsa_rank)]; }
  ncclComm_t nccl() const override { return comm_; }

  std::vector<std::string> exchange(const std::string& mine, const char* what) override {
    ASYNCTP_CHECK(mine.size() <= kExchangeBytes, what, ": ", mine.size(), " bytes to exchange; at most ", kExchangeBytes);
    if (world_size_ == 1) return {mine};
    refuse_if_stuck();
    const size_t bytes = mine.size();
    auto* host = static_cast<char*>(exchange_host_);  // pinned: the copies below are plain DMA
    std::memcpy(host, mine.data(), bytes);
    char* slot = static_cast<char*>(exchange_dev_) + static_cast<size_t>(rank_) * bytes;
    ASYNCTP_CUDA_CHECK(cudaMemcpyAsync(slot, host, bytes, cudaMemcpyHostToDevice, stream_));
    ASYNCTP_NCCL_CHECK(ncclAllGather(slot, exchange_dev_, bytes, ncclChar, check_comm_, stream_));
    ASYNCTP_CUDA_CHECK(cudaMemcpyAsync(host + kExchangeBytes, exchange_dev_, bytes * world_size_, cudaMemcpyDeviceToHost,
                                       stream_));
    wait_(stream_, what);
    std::vector<std::string> all;
    for (int r = 0; r < world_size_; ++r) all.emplace_back(host + kExchangeBytes + r * bytes, bytes);
    return all;
  }

  size_t alignment() const override { return NCCL_WIN_REQUIRED_ALIGNMENT; }

  SymmetricMapping map_symmetric(size_t bytes) override {
    refuse_if_stuck();
    SymmetricMapping m;
    m.bytes = (bytes + alignment() - 1) / alignment() * alignment();
    ASYNCTP_CUDA_CHECK(cudaSetDevice(device_));
    ASYNCTP_NCCL_CHECK(ncclMemAlloc(&m.local, m.bytes));
    // Zeroed before registration: the collective registration then orders every rank's zeroing before
    // any peer can use the memory.
    ASYNCTP_CUDA_CHECK(cudaMemsetAsync(m.local, 0, m.bytes, stream_));
    ASYNCTP_CUDA_CHECK(cudaStreamSynchronize(stream_));
    try {
      m.window = within_bound<ncclWindow_t>(
          device_, rank_, setup_bound_ms_, "ncclCommWindowRegister (symmetric memory)",
          [comm = comm_, local = m.local, bytes = m.bytes] {
            ncclWindow_t window = nullptr;
            ASYNCTP_NCCL_CHECK(ncclCommWindowRegister(comm, local, bytes, &window, NCCL_WIN_COLL_SYMMETRIC));
            return window;
          });
    } catch (const SetupStuck& e) {
      stuck_ = e.what();  // every later NCCL call of this transport refuses, quoting it
      nccl_done_ = true;
      throw;
    }
    const int n = lsa_.size;
    ASYNCTP_CUDA_CHECK(cudaMalloc(&m.device_peers, sizeof(void*) * n));
    read_lsa_pointers<<<1, 32, 0, stream_>>>(m.window, n, m.device_peers);
    ASYNCTP_CUDA_CHECK(cudaGetLastError());
    m.peers.resize(n);
    ASYNCTP_CUDA_CHECK(cudaMemcpyAsync(m.peers.data(), m.device_peers, sizeof(void*) * n, cudaMemcpyDeviceToHost, stream_));
    ASYNCTP_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return m;
  }

  void unmap_symmetric(SymmetricMapping& m) override {
    if (nccl_done_) {  // NCCL is aborted or stuck: its memory goes with the process
      m = SymmetricMapping{};
      return;
    }
    // Deregistering is collective: a peer that is gone would hold it for good, so it has the set-up
    // bound, and past it NCCL is left to the process's end.
    if (m.window && !finish_within_bound("ncclCommWindowDeregister (symmetric memory)",
                                         [comm = comm_, window = m.window] { ncclCommWindowDeregister(comm, window); })) {
      m = SymmetricMapping{};
      return;
    }
    if (m.local) ncclMemFree(m.local);
    if (m.device_peers) cudaFree(m.device_peers);
    m = SymmetricMapping{};
  }

  void all_gather(const void* send, void* recv, size_t bytes, cudaStream_t stream) override {
    refuse_if_stuck();
    ASYNCTP_NCCL_CHECK(ncclAllGather(send, recv, bytes, ncclChar, comm_, stream));
  }

  void reduce_scatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                      cudaStream_t stream) override {
    refuse_if_stuck();
    ASYNCTP_NCCL_CHECK(ncclReduceScatter(send, recv, count, nccl_type(dtype), op == ReduceOp::kAvg ? ncclAvg : ncclSum,
                                         comm_, stream));
  }

  void stop_kernels() override {
    // ncclCommAbort first raises the flag NCCL's kernels poll, so a kernel waiting on a dead peer
    // ends; what it does next was seen to block for good with a peer's process gone, so it runs on a
    // thread of its own, left behind. A communicator given to Communicator::wrap is its owner's.
    if (!owns_) return;
    {
      // Not while async_error() reads the communicator on the caller's thread.
      const std::lock_guard<std::mutex> lock(async_mu_);
      if (nccl_done_.exchange(true)) return;
    }
    std::thread([comm = comm_, check = check_comm_] {
      ncclCommAbort(comm);
      if (check != nullptr) ncclCommAbort(check);
    }).detach();
  }

  std::string async_error() override {
    // A peer process that died can surface here first (ncclRemoteError, ncclSystemError).
    ncclResult_t async = ncclSuccess;
    const std::lock_guard<std::mutex> lock(async_mu_);  // stop_kernels() may abort comm_ meanwhile
    if (nccl_done_ || ncclCommGetAsyncError(comm_, &async) != ncclSuccess) return {};
    if (async == ncclSuccess || async == ncclInProgress) return {};
    return detail::cat("NCCL reported an asynchronous error (", ncclGetErrorString(async), ")");
  }

  std::string abandon(const std::string&, bool kernels_may_wait) override {
    if (kernels_may_wait) {
      // An NCCL kernel may still wait on a peer that is gone; ncclCommAbort was seen to block for good
      // then (and to keep the process from exiting), so NCCL is left for the process's end to reclaim.
      nccl_done_ = true;
      return "; an NCCL kernel may still be waiting on the device: end the process (its exit reclaims the GPU)";
    }
    bool finished = true;
    if (check_comm_ != nullptr) {
      finished = finish_within_bound("ncclCommAbort", kAbortWaitMs, [c = check_comm_] { ncclCommAbort(c); });
    }
    if (owns_) finished = finish_within_bound("ncclCommAbort", kAbortWaitMs, [c = comm_] { ncclCommAbort(c); }) && finished;
    nccl_done_ = true;
    if (!owns_) return "; call ncclCommAbort on the communicator given to Communicator::wrap (asynctp does not own it)";
    return finished ? "; NCCL was aborted"
                    : detail::cat("; ncclCommAbort had not returned after ", kAbortWaitMs, " ms: end the process");
  }

  void shutdown(bool healthy) override {
    shut_down_ = true;
    if (healthy && !nccl_done_) {
      cudaFree(exchange_dev_);
      cudaFreeHost(exchange_host_);
      // Destroying waits for the peers' side of NCCL's work: bounded like the set-up.
      if (check_comm_) finish_within_bound("ncclCommDestroy (the exchanges' communicator)", [c = check_comm_] { ncclCommDestroy(c); });
      if (has_dev_comm_ && !nccl_done_) {
        finish_within_bound("ncclDevCommDestroy", [comm = comm_, dev = dev_comm_]() mutable { ncclDevCommDestroy(comm, &dev); });
      }
    } else if (check_comm_ && !nccl_done_) {
      ncclCommAbort(check_comm_);
    }
    if (stream_) cudaStreamDestroy(stream_);
    stream_ = nullptr;
    if (owns_ && !nccl_done_) {
      if (healthy) {
        finish_within_bound("ncclCommDestroy", [c = comm_] { ncclCommDestroy(c); });
      } else {
        ncclCommAbort(comm_);
      }
    }
    nccl_done_ = true;
  }

 private:
  // Runs a teardown call of NCCL's (an abort, a destroy, a deregistration) with a bound, the set-up
  // bound unless given; false where it did not return (then NCCL is left to the process's end:
  // nccl_done_, and later calls refuse quoting why).
  template <typename Fn>
  bool finish_within_bound(const char* what, Fn fn) {
    return finish_within_bound(what, setup_bound_ms_, fn);
  }
  template <typename Fn>
  bool finish_within_bound(const char* what, int bound_ms, Fn fn) {
    try {
      within_bound<int>(device_, rank_, bound_ms, what, [fn]() mutable {
        fn();
        return 0;
      });
      return true;
    } catch (const SetupStuck& e) {
      stuck_ = e.what();
      nccl_done_ = true;
      return false;
    } catch (...) {
      return true;  // teardown errors were ignored before as well: nothing more can be done
    }
  }

  void refuse_if_stuck() const {
    if (!stuck_.empty()) detail::raise(detail::cat("this communicator's NCCL is stuck in set-up: ", stuck_));
  }

  ncclComm_t comm_ = nullptr;
  bool owns_ = false;
  BoundedWait wait_;
  int setup_bound_ms_ = 0;
  std::string stuck_;  // a set-up call that did not return within its bound (SetupStuck's message)
  int rank_ = 0, world_size_ = 1, device_ = 0;
  Team lsa_;
  std::vector<int> lsa_world_;
  ncclComm_t check_comm_ = nullptr;  // split off comm_: exchanges never queue behind data collectives
  cudaStream_t stream_ = nullptr;    // for the exchanges and the set-up work
  void* exchange_dev_ = nullptr;
  void* exchange_host_ = nullptr;    // pinned: this rank's part, then every rank's
  ncclDevComm dev_comm_{};
  bool has_dev_comm_ = false;
  std::atomic<bool> nccl_done_{false};  // NCCL was aborted, or must not be touched again (any thread)
  std::mutex async_mu_;                 // async_error() against stop_kernels() on the watchdog's thread
  bool shut_down_ = false;
};

}  // namespace

std::unique_ptr<Transport> make_nccl_transport(ncclComm_t comm, bool owns, BoundedWait wait, int setup_bound_ms) {
  return std::make_unique<NcclTransport>(comm, owns, std::move(wait), setup_bound_ms);
}

}  // namespace asynctp::comm
