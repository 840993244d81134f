#include <cuda_runtime_api.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <future>
#include <memory>
#include <random>
#include <thread>

#include "algo/overlap_resources.h"
#include "asynctp/version.h"
#include "comm/communicator_impl.h"
#include "common/check.h"
#include "common/device_fault.h"
#include "common/env.h"
#include "kernels/fused/tail_split.h"

namespace asynctp {
namespace {

// LSA barriers NCCL reserves for our kernels: one per CTA of a persistent kernel on a full H100/H200.
constexpr int kLsaBarrierCount = 132;
constexpr int kBusIdBytes = 32;

// Every LSA peer must be reachable by load/store. NCCL builds the LSA team from its own topology
// detection; where a peer's GPU is visible to this process too, the CUDA runtime is asked as well, so
// a platform that disables P2P is named here rather than faulting in a kernel later.
std::string check_p2p(Communicator::Impl& impl, const std::vector<std::string>& bus_ids) {
  for (int i = 0; i < impl.lsa.size; ++i) {
    if (i == impl.lsa.rank) continue;
    const int peer = impl.lsa_world_ranks[i];
    int peer_device = -1;
    if (cudaDeviceGetByPCIBusId(&peer_device, bus_ids[peer].c_str()) != cudaSuccess) {
      (void)cudaGetLastError();  // not visible here (CUDA_VISIBLE_DEVICES): NCCL's word stands
      continue;
    }
    int can = 0;
    ASYNCTP_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, impl.device, peer_device));
    if (!can) {
      return detail::cat("GPU ", impl.device, " (", bus_ids[impl.rank], ") has no P2P access to GPU ", peer_device,
                         " (", bus_ids[peer], ") of rank ", peer);
    }
  }
  return {};
}

std::unique_ptr<Communicator::Impl> make_impl(ncclComm_t comm, bool owns, const CommunicatorOptions& options) {
  auto impl = std::make_unique<Communicator::Impl>();
  impl->comm = comm;
  impl->owns_comm = owns;
  ASYNCTP_NCCL_CHECK(ncclCommUserRank(comm, &impl->rank));
  ASYNCTP_NCCL_CHECK(ncclCommCount(comm, &impl->world_size));
  ASYNCTP_NCCL_CHECK(ncclCommCuDevice(comm, &impl->device));
  detail::set_process_rank(impl->rank);
  impl->timeout_ms = detail::resolve_timeout_ms(options.timeout_ms);
  ASYNCTP_CHECK(options.signal_count > 0, "CommunicatorOptions::signal_count must be > 0, got ", options.signal_count);
  impl->signal_count = options.signal_count;
  impl->check_nonfinite = detail::env_flag("ASYNCTP_CHECK_NAN");
  impl->tuning_cache = options.tuning_cache;
  if (impl->tuning_cache.empty()) {
    const char* env = std::getenv("ASYNCTP_TUNING_CACHE");
    if (env != nullptr) impl->tuning_cache = env;
  }
  ASYNCTP_CUDA_CHECK(cudaSetDevice(impl->device));
  cudaDeviceProp prop{};
  ASYNCTP_CUDA_CHECK(cudaGetDeviceProperties(&prop, impl->device));
  impl->cc_major = prop.major;
  impl->cc_minor = prop.minor;
  impl->gpu_name = prop.name;
  // Allocated now, not at the first wait: a wait may be enqueued while a CUDA graph is being
  // captured, where allocating pinned memory is not allowed.
  impl->fault = detail::device_fault_record();
  ASYNCTP_CUDA_CHECK(cudaStreamCreateWithFlags(&impl->setup_stream, cudaStreamNonBlocking));
  ASYNCTP_CUDA_CHECK(cudaMalloc(&impl->exchange_buf, static_cast<size_t>(impl->world_size) * kBusIdBytes));

  const ncclTeam_t team = ncclTeamLsa(comm);
  impl->lsa = Team{team.rank, team.nRanks};
  for (int i = 0; i < team.nRanks; ++i) impl->lsa_world_ranks.push_back(ncclTeamRankToWorld(comm, team, i));
  return impl;
}

}  // namespace

std::vector<std::string> Communicator::Impl::allgather_short(const std::string& mine) {
  ASYNCTP_CHECK(mine.size() < static_cast<size_t>(kBusIdBytes), "allgather_short: ", mine.size(), " bytes; at most ",
                kBusIdBytes - 1);
  char padded[kBusIdBytes] = {};
  std::memcpy(padded, mine.data(), mine.size());
  auto* bytes = reinterpret_cast<char*>(exchange_buf);
  ASYNCTP_CUDA_CHECK(cudaMemcpyAsync(bytes + rank * kBusIdBytes, padded, kBusIdBytes, cudaMemcpyHostToDevice,
                                     setup_stream));
  ASYNCTP_NCCL_CHECK(ncclAllGather(bytes + rank * kBusIdBytes, bytes, kBusIdBytes, ncclChar, comm, setup_stream));
  std::vector<char> all(static_cast<size_t>(world_size) * kBusIdBytes);
  ASYNCTP_CUDA_CHECK(cudaMemcpyAsync(all.data(), bytes, all.size(), cudaMemcpyDeviceToHost, setup_stream));
  wait_bounded(setup_stream, timeout_ms, "Communicator: exchanging set-up values");
  std::vector<std::string> out;
  for (int r = 0; r < world_size; ++r) out.emplace_back(all.data() + r * kBusIdBytes, strnlen(all.data() + r * kBusIdBytes, kBusIdBytes));
  return out;
}

// Where the whole world shares one node, the ops' argument checks go through shared host memory.
// Any rank that cannot map it makes every rank fall back to checks over NCCL.
static void open_mailbox(Communicator::Impl& m) {
  if (m.lsa.size != m.world_size || m.world_size == 1) return;
  std::string name;
  if (m.rank == 0) {
    std::random_device rd;
    name = detail::cat("/asynctp-", ::getpid(), "-", rd() % 1000000);
  }
  name = m.allgather_short(name)[0];
  std::unique_ptr<HostMailbox> box;
  try {
    if (m.rank == 0) box = HostMailbox::create(name, 0, m.world_size);
  } catch (const Error&) {
  }
  if (!m.failing_ranks(m.rank != 0 || box != nullptr).empty()) return;
  try {
    if (m.rank != 0) box = HostMailbox::create(name, m.rank, m.world_size);
  } catch (const Error&) {
  }
  const bool everyone = m.failing_ranks(box != nullptr).empty();
  if (m.rank == 0) HostMailbox::unlink(name);  // every rank has it open (or gave up): no name left behind
  if (everyone) m.mailbox = std::move(box);
}

std::vector<int> Communicator::Impl::failing_ranks(bool local_ok) {
  const int mine = local_ok ? 1 : 0;
  ASYNCTP_CUDA_CHECK(cudaMemcpyAsync(exchange_buf + rank, &mine, sizeof mine, cudaMemcpyHostToDevice, setup_stream));
  ASYNCTP_NCCL_CHECK(ncclAllGather(exchange_buf + rank, exchange_buf, 1, ncclInt32, comm, setup_stream));
  std::vector<int> all(world_size);
  ASYNCTP_CUDA_CHECK(cudaMemcpyAsync(all.data(), exchange_buf, sizeof(int) * world_size, cudaMemcpyDeviceToHost,
                                     setup_stream));
  wait_bounded(setup_stream, timeout_ms, "Communicator: agreeing across ranks");
  std::vector<int> failing;
  for (int r = 0; r < world_size; ++r) {
    if (all[r] == 0) failing.push_back(r);
  }
  return failing;
}

void Communicator::Impl::require_usable(const char* what) const {
  if (broken.empty()) return;
  detail::raise(detail::cat(what, ": this communicator can no longer be used, since ", broken,
                            ". Destroy it (and end the process if its CUDA context is lost) and make a new one"));
}

namespace {

// How long abandon() waits for ncclCommAbort. It is only called where nothing of NCCL's should be
// running, but an abort that blocks anyway (one did, with an NCCL kernel waiting on a peer whose
// process was gone) must not turn an error into a hang.
constexpr int kAbortWaitMs = 5000;

// Runs ncclCommAbort on a thread of its own; true if it returned within kAbortWaitMs (else the thread
// is left to it, and the process should end).
bool abort_within_bound(ncclComm_t c) {
  auto done = std::make_shared<std::promise<void>>();
  std::future<void> finished = done->get_future();
  std::thread([c, done] {
    ncclCommAbort(c);
    done->set_value();
  }).detach();
  return finished.wait_for(std::chrono::milliseconds(kAbortWaitMs)) == std::future_status::ready;
}

}  // namespace

std::string Communicator::Impl::abandon(const std::string& why, NcclFate fate) {
  if (!broken.empty()) return {};
  broken = why;
  const bool owned = owns_comm && constructed;  // before that, Communicator::create aborts NCCL itself
  if (fate == NcclFate::kLeave) {
    nccl_done = true;
    return "; an NCCL kernel may still be waiting on the device: end the process (its exit reclaims the GPU)";
  }
  bool finished = true;
  if (check_comm != nullptr) finished = abort_within_bound(check_comm);
  if (owned) finished = abort_within_bound(comm) && finished;
  nccl_done = true;
  if (!owns_comm) return "; call ncclCommAbort on the communicator given to Communicator::wrap (asynctp does not own it)";
  return finished ? "; NCCL was aborted"
                  : detail::cat("; ncclCommAbort had not returned after ", kAbortWaitMs, " ms: end the process");
}

void Communicator::Impl::wait_bounded(cudaStream_t stream, int64_t wait_ms, const char* what) {
  require_usable(what);
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::milliseconds(wait_ms);
  auto next_nccl_poll = start;
  for (int spin = 0;; ++spin) {
    const cudaError_t e = cudaStreamQuery(stream);
    if (e == cudaSuccess) return;
    if (e != cudaErrorNotReady) {
      const std::string fault = detail::describe_device_fault();
      abandon(fault.empty() ? detail::cat("a CUDA error (", cudaGetErrorName(e), ") ended a wait") : fault,
              NcclFate::kAbort);
      detail::raise_cuda(e, detail::cat(what, ": cudaStreamQuery").c_str(), __FILE__, __LINE__);
    }
    const auto now = Clock::now();
    if (now >= next_nccl_poll) {
      // A peer process that died can surface here first (ncclRemoteError, ncclSystemError).
      ncclResult_t async = ncclSuccess;
      if (!nccl_done && ncclCommGetAsyncError(comm, &async) == ncclSuccess && async != ncclSuccess &&
          async != ncclInProgress) {
        const std::string why = detail::cat("NCCL reported an asynchronous error (", ncclGetErrorString(async),
                                            ") while ", what, " waited");
        const std::string aborted = abandon(why, NcclFate::kLeave);
        detail::raise(detail::cat(what, ": ", why, aborted, "; this communicator can no longer be used"));
      }
      next_nccl_poll = now + std::chrono::milliseconds(10);
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
  const std::string aborted = abandon(why, NcclFate::kLeave);
  detail::raise(detail::cat(why, aborted));
}

void* Communicator::Impl::scratch_for(size_t bytes) {
  if (bytes > scratch_bytes) {
    // The old scratch may still be in use by enqueued work: cudaFree waits for the device.
    if (scratch) ASYNCTP_CUDA_CHECK(cudaFree(scratch));
    scratch = nullptr;
    scratch_bytes = 0;
    ASYNCTP_CUDA_CHECK(cudaMalloc(&scratch, bytes));
    scratch_bytes = bytes;
  }
  return scratch;
}

void* Communicator::Impl::tail_split_workspace(cudaStream_t stream) {
  if (tail_split != nullptr) return tail_split;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  ASYNCTP_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  if (capture != cudaStreamCaptureStatusNone) return nullptr;
  int sms = 0;
  ASYNCTP_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const size_t bytes = kernels::fused::tail_split_workspace_bytes(sms);
  void* p = nullptr;
  ASYNCTP_CUDA_CHECK(cudaMalloc(&p, bytes));
  cudaError_t zeroed = cudaMemsetAsync(p, 0, bytes, setup_stream);
  if (zeroed == cudaSuccess) zeroed = cudaStreamSynchronize(setup_stream);
  if (zeroed != cudaSuccess) {
    cudaFree(p);
    ASYNCTP_CUDA_CHECK(zeroed);
  }
  tail_split = p;
  tail_split_sms = sms;
  return tail_split;
}

std::unique_ptr<Communicator> Communicator::create(int rank, int world_size, const ncclUniqueId& id,
                                                   const CommunicatorOptions& options) {
  ASYNCTP_CHECK(world_size >= 1, "Communicator::create: world_size must be >= 1, got ", world_size);
  ASYNCTP_CHECK(rank >= 0 && rank < world_size, "Communicator::create: rank must be in [0, ", world_size,
                "), got ", rank);
  detail::set_process_rank(rank);
  check_nccl_versions_match(nccl_runtime_version(), nccl_build_version());
  int device = options.device;
  if (device < 0) ASYNCTP_CUDA_CHECK(cudaGetDevice(&device));
  int count = 0;
  ASYNCTP_CUDA_CHECK(cudaGetDeviceCount(&count));
  ASYNCTP_CHECK(device < count, "Communicator::create: options.device is ", device, " but this process sees ", count,
                " GPU(s) (check CUDA_VISIBLE_DEVICES)");
  ASYNCTP_CUDA_CHECK(cudaSetDevice(device));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 1;
  ncclComm_t comm = nullptr;
  ASYNCTP_NCCL_CHECK(ncclCommInitRankConfig(&comm, world_size, id, rank, &config));
  try {
    return std::unique_ptr<Communicator>(new Communicator(make_impl(comm, /*owns=*/true, options)));
  } catch (...) {
    ncclCommAbort(comm);
    throw;
  }
}

std::unique_ptr<Communicator> Communicator::wrap(ncclComm_t comm, const CommunicatorOptions& options) {
  ASYNCTP_CHECK(comm != nullptr, "Communicator::wrap: comm is null; pass an initialised ncclComm_t");
  check_nccl_versions_match(nccl_runtime_version(), nccl_build_version());
  return std::unique_ptr<Communicator>(new Communicator(make_impl(comm, /*owns=*/false, options)));
}

Communicator::Communicator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {
  Impl& m = *impl_;
  // P2P: every rank shares its PCI bus id, checks its LSA peers, then all ranks decide together.
  char bus[kBusIdBytes] = {};
  ASYNCTP_CUDA_CHECK(cudaDeviceGetPCIBusId(bus, kBusIdBytes, m.device));
  const std::vector<std::string> bus_ids = m.allgather_short(bus);
  const std::string problem = check_p2p(m, bus_ids);
  const std::vector<int> failing = m.failing_ranks(problem.empty());
  if (!failing.empty()) {
    std::string ranks;
    for (int r : failing) ranks += detail::cat(ranks.empty() ? "" : ", ", r);
    detail::raise(detail::cat("Communicator: P2P access check failed on rank(s) ", ranks,
                              problem.empty() ? "" : ": ", problem,
                              ". asynctp needs load/store access (NVLink or PCIe P2P) between the GPUs of its LSA "
                              "team; check `nvidia-smi topo -p2p r` and that P2P is not disabled (NCCL_P2P_DISABLE)."));
  }

  ncclDevCommRequirements reqs;
  std::memset(&reqs, 0, sizeof reqs);
  reqs.lsaBarrierCount = kLsaBarrierCount;
  reqs.lsaMultimem = false;  // NVLink multicast stays off: it can take the host's GPUs out of service
  ASYNCTP_NCCL_CHECK(ncclDevCommCreate(m.comm, &reqs, &m.dev_comm));
  m.has_dev_comm = true;
  ASYNCTP_CUBLAS_CHECK(cublasLtCreate(&m.cublaslt));
  m.gemm.init(m.cublaslt);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 1;
  ASYNCTP_NCCL_CHECK(ncclCommSplit(m.comm, 0, m.rank, &m.check_comm, &config));
  ASYNCTP_CUDA_CHECK(cudaStreamCreateWithFlags(&m.check_stream, cudaStreamNonBlocking));
  ASYNCTP_CUDA_CHECK(cudaMalloc(&m.check_buf, sizeof(int64_t) * kCheckSlots * m.world_size));
  ASYNCTP_CUDA_CHECK(cudaMallocHost(&m.check_host, sizeof(int64_t) * kCheckSlots * (m.world_size + 1)));
  open_mailbox(m);

  ASYNCTP_CHECK(m.lsa.size >= 1, "Communicator: NCCL reports an empty LSA team");
  m.signals = SignalPad::create(*this, m.signal_count);
  m.barrier_pad = SignalPad::create(*this, m.lsa.size);
  ASYNCTP_CUDA_CHECK(cudaMalloc(&m.barrier_epoch, sizeof(uint32_t)));
  ASYNCTP_CUDA_CHECK(cudaMemsetAsync(m.barrier_epoch, 0, sizeof(uint32_t), m.setup_stream));
  ASYNCTP_CUDA_CHECK(cudaStreamSynchronize(m.setup_stream));
  m.constructed = true;
}

Communicator::~Communicator() {
  Impl& m = *impl_;
  cudaSetDevice(m.device);
  // After a kernel trapped (a wait timed out) the context is gone, and a broken communicator may have
  // peers that are gone or an NCCL kernel that still waits: collective teardown could hang, and so
  // could cudaFree (it waits for the device). The resources are then left to the dying process.
  const bool healthy = m.broken.empty() && cudaDeviceSynchronize() == cudaSuccess;
  if (healthy) {
    m.overlap.reset();
    m.workspace.reset();
    m.barrier_pad.reset();
    m.signals.reset();
    cudaFree(m.barrier_epoch);
    cudaFree(m.exchange_buf);
    cudaFree(m.check_buf);
    cudaFreeHost(m.check_host);
    cudaFree(m.scratch);
    cudaFree(m.tail_split);
    cudaFree(m.nonfinite_buf);
    cudaFreeHost(m.nonfinite_host);
    if (m.check_comm) ncclCommDestroy(m.check_comm);
    if (m.has_dev_comm) ncclDevCommDestroy(m.comm, &m.dev_comm);
  } else {
    (void)m.overlap.release();
    (void)m.workspace.release();
    (void)m.barrier_pad.release();
    (void)m.signals.release();
    if (m.check_comm && !m.nccl_done) ncclCommAbort(m.check_comm);
  }
  m.gemm.reset(/*free_device_memory=*/m.broken.empty());  // plans go before the handle they were made with
  if (m.cublaslt) cublasLtDestroy(m.cublaslt);
  if (m.setup_stream) cudaStreamDestroy(m.setup_stream);
  if (m.check_stream) cudaStreamDestroy(m.check_stream);
  if (m.owns_comm && !m.nccl_done) {
    if (healthy) {
      ncclCommDestroy(m.comm);
    } else {
      ncclCommAbort(m.comm);
    }
  }
}

int Communicator::rank() const { return impl_->rank; }
int Communicator::world_size() const { return impl_->world_size; }
int Communicator::device() const { return impl_->device; }
int Communicator::timeout_ms() const { return impl_->timeout_ms; }
Team Communicator::lsa() const { return impl_->lsa; }
ncclComm_t Communicator::nccl() const { return impl_->comm; }
cublasLtContext* Communicator::cublaslt() const { return impl_->cublaslt; }
SignalPad& Communicator::signals() { return *impl_->signals; }

int Communicator::lsa_to_world(int lsa_rank) const {
  ASYNCTP_CHECK(lsa_rank >= 0 && lsa_rank < impl_->lsa.size, "lsa_to_world: lsa_rank must be in [0, ",
                impl_->lsa.size, "), got ", lsa_rank);
  return impl_->lsa_world_ranks[lsa_rank];
}

SymmetricBuffer& Communicator::workspace(size_t bytes) {
  impl_->require_usable("Communicator::workspace");
  ASYNCTP_CHECK(bytes > 0, "Communicator::workspace: bytes must be > 0");
  if (!impl_->workspace || impl_->workspace->size() < bytes) {
    // Grow geometrically so a sequence of slightly larger requests does not reallocate every time.
    size_t grown = impl_->workspace ? impl_->workspace->size() : 0;
    grown = std::max(bytes, grown + grown / 2);
    impl_->workspace.reset();
    impl_->workspace = SymmetricBuffer::create(*this, grown);
  }
  return *impl_->workspace;
}

void Communicator::synchronize(cudaStream_t stream) const {
  // Twice the device-side bound, so a kernel's own timeout report (which names the flag and the
  // peer) arrives before this host-side one.
  impl_->wait_bounded(stream, 2 * static_cast<int64_t>(impl_->timeout_ms), "Communicator::synchronize");
}

bool Communicator::all_ok(bool local_ok) { return impl_->failing_ranks(local_ok).empty(); }

void Communicator::require_hopper(const char* what) const {
  check_hopper(impl_->cc_major, impl_->cc_minor, impl_->gpu_name.c_str(), impl_->device, what);
}

uint64_t timeout_ns(const Communicator& comm) { return static_cast<uint64_t>(comm.timeout_ms()) * 1000000ull; }

}  // namespace asynctp
