// Making and destroying a communicator, for both transports, and its public members
// (asynctp/communicator.h). What its internals do during calls is in communicator_impl.cc.
#include <cuda_runtime_api.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <thread>

#include "asynctp/in_process.h"
#include "asynctp/launcher.h"
#include "asynctp/version.h"
#include "comm/bounded_call.h"
#include "comm/communicator_impl.h"
#include "comm/in_process_transport.h"
#include "comm/nccl_transport.h"
#include "common/check.h"
#include "common/device_fault.h"
#include "common/driver_api.h"
#include "common/env.h"

namespace asynctp {
namespace {

constexpr int kBusIdBytes = 32;
// SMs left free per rank where ranks share a GPU: room for the one-warp wait and signal kernels and the
// copies within one GPU (which run as kernels) beside every rank's persistent GEMM.
constexpr int kSmsLeftPerSharingRank = 2;

// Every LSA peer must be reachable by load/store. The transport builds the LSA team from its own
// topology detection; where a peer's GPU is visible to this process too, the CUDA runtime is asked as
// well, so a platform that disables P2P is named here rather than faulting in a kernel later.
std::string check_p2p(Communicator::Impl& impl, const std::vector<std::string>& bus_ids) {
  for (int i = 0; i < impl.lsa.size; ++i) {
    if (i == impl.lsa.rank) continue;
    const int peer = impl.transport->lsa_to_world(i);
    int peer_device = -1;
    if (cudaDeviceGetByPCIBusId(&peer_device, bus_ids[peer].c_str()) != cudaSuccess) {
      (void)cudaGetLastError();  // not visible here (CUDA_VISIBLE_DEVICES): the transport's word stands
      continue;
    }
    if (peer_device == impl.device) continue;  // ranks that share a GPU
    int can = 0;
    ASYNCTP_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, impl.device, peer_device));
    if (!can) {
      return detail::cat("GPU ", impl.device, " (", bus_ids[impl.rank], ") has no P2P access to GPU ", peer_device,
                         " (", bus_ids[peer], ") of rank ", peer);
    }
  }
  return {};
}

// The SMs a rank's persistent kernels may use: the caller's budget, else the whole GPU, or where
// `sharing` ranks share it, an equal share of what is left beside their small kernels; whole clusters
// (2 SMs) and at least one.
int resolve_sm_budget(int requested, int device, int sharing) {
  int sms = 0;
  ASYNCTP_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  int budget = requested > 0 ? std::min(requested, sms)
                             : sharing <= 1 ? sms : (sms - kSmsLeftPerSharingRank * sharing) / sharing;
  budget -= budget % 2;
  ASYNCTP_CHECK(budget >= 2, "CommunicatorOptions::sm_budget: ", requested > 0 ? requested : budget,
                " SM(s) leave no room for one 2-CTA cluster of the fused kernel; expected at least 2 (the GPU has ",
                sms, ", shared by ", sharing, " rank(s))");
  return budget;
}

// What every communicator holds apart from its transport, which `make_transport` then makes.
template <typename MakeTransport>
std::unique_ptr<Communicator::Impl> make_impl(int rank, int device, int sharing, const CommunicatorOptions& options,
                                              MakeTransport make_transport) {
  auto impl = std::make_unique<Communicator::Impl>();
  impl->rank = rank;
  impl->device = device;
  impl->timeout_ms = detail::resolve_timeout_ms(options.timeout_ms);
  ASYNCTP_CHECK(options.signal_count > 0, "CommunicatorOptions::signal_count must be > 0, got ", options.signal_count);
  ASYNCTP_CHECK(options.sm_budget >= 0, "CommunicatorOptions::sm_budget must be >= 0 (0: the default), got ",
                options.sm_budget);
  impl->sm_budget = resolve_sm_budget(options.sm_budget, device, sharing);
  impl->ranks_on_device = sharing;
  impl->signal_count = options.signal_count;
  impl->check_nonfinite = detail::knob_flag(detail::Knob::kCheckNan);
  impl->tuning_cache = options.tuning_cache;
  impl->on_overdue = options.on_overdue;
  if (impl->tuning_cache.empty()) impl->tuning_cache = detail::knob_text(detail::Knob::kTuningCache);
  ASYNCTP_CUDA_CHECK(cudaSetDevice(device));
  cudaDeviceProp prop{};
  ASYNCTP_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  impl->cc_major = prop.major;
  impl->cc_minor = prop.minor;
  impl->gpu_name = prop.name;
  // Allocated now, not at the first wait: a wait may be enqueued while a CUDA graph is being
  // captured, where allocating pinned memory is not allowed.
  impl->fault = detail::device_fault_record();
  ASYNCTP_CUDA_CHECK(cudaStreamCreateWithFlags(&impl->setup_stream, cudaStreamNonBlocking));
  Communicator::Impl* m = impl.get();
  impl->transport = make_transport(m);
  impl->world_size = impl->transport->world_size();
  impl->lsa = impl->transport->lsa();
  return impl;
}

comm::BoundedWait bounded_wait(Communicator::Impl* m) {
  return [m](cudaStream_t stream, const char* what) { m->wait_bounded(stream, m->timeout_ms, what); };
}

}  // namespace

std::vector<std::string> Communicator::Impl::allgather_short(const std::string& mine) {
  ASYNCTP_CHECK(mine.size() < static_cast<size_t>(kBusIdBytes), "allgather_short: ", mine.size(), " bytes; at most ",
                kBusIdBytes - 1);
  std::string padded(kBusIdBytes, '\0');
  std::memcpy(padded.data(), mine.data(), mine.size());
  std::vector<std::string> out;
  for (const std::string& part : exchange(padded, "Communicator: exchanging set-up values")) {
    out.emplace_back(part.data(), strnlen(part.data(), part.size()));
  }
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

std::unique_ptr<Communicator> Communicator::create(int rank, int world_size, const ncclUniqueId& id,
                                                   const CommunicatorOptions& options) {
  ASYNCTP_CHECK(world_size >= 1, "Communicator::create: world_size must be >= 1, got ", world_size);
  ASYNCTP_CHECK(rank >= 0 && rank < world_size, "Communicator::create: rank must be in [0, ", world_size,
                "), got ", rank);
  const detail::RankScope scope(rank);
  check_nccl_versions_match(nccl_runtime_version(), nccl_build_version());
  int device = options.device;
  if (device < 0) ASYNCTP_CUDA_CHECK(cudaGetDevice(&device));
  int count = 0;
  ASYNCTP_CUDA_CHECK(cudaGetDeviceCount(&count));
  ASYNCTP_CHECK(device < count, "Communicator::create: options.device is ", device, " but this process sees ", count,
                " GPU(s) (check CUDA_VISIBLE_DEVICES)");
  ASYNCTP_CUDA_CHECK(cudaSetDevice(device));
  // NCCL's initialisation waits for every rank with no bound of its own: it runs with one.
  const int bound_ms = comm::setup_bound_ms(detail::resolve_timeout_ms(options.timeout_ms));
  const ncclUniqueId nccl_id = id;
  const ncclComm_t comm = comm::within_bound<ncclComm_t>(
      device, rank, bound_ms, "ncclCommInitRankConfig (making the NCCL communicator)", [nccl_id, world_size, rank] {
        ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
        config.blocking = 1;
        ncclComm_t made = nullptr;
        ASYNCTP_NCCL_CHECK(ncclCommInitRankConfig(&made, world_size, nccl_id, rank, &config));
        return made;
      });
  std::unique_ptr<Impl> impl;
  bool owned = false;  // by the transport, once it is made: it aborts the communicator if set-up fails
  try {
    impl = make_impl(rank, device, /*sharing=*/1, options, [comm, &owned, bound_ms](Impl* m) {
      auto t = comm::make_nccl_transport(comm, /*owns=*/true, bounded_wait(m), bound_ms);
      owned = true;
      return t;
    });
  } catch (const comm::SetupStuck&) {
    throw;  // an abort could block as well: NCCL is left to the process's end
  } catch (...) {
    if (!owned) ncclCommAbort(comm);
    throw;
  }
  return made(std::move(impl));
}

std::unique_ptr<Communicator> Communicator::wrap(ncclComm_t comm, const CommunicatorOptions& options) {
  ASYNCTP_CHECK(comm != nullptr, "Communicator::wrap: comm is null; pass an initialised ncclComm_t");
  check_nccl_versions_match(nccl_runtime_version(), nccl_build_version());
  int rank = 0, device = 0;
  ASYNCTP_NCCL_CHECK(ncclCommUserRank(comm, &rank));
  ASYNCTP_NCCL_CHECK(ncclCommCuDevice(comm, &device));
  const detail::RankScope scope(rank);
  const int bound_ms = comm::setup_bound_ms(detail::resolve_timeout_ms(options.timeout_ms));
  auto impl = make_impl(rank, device, /*sharing=*/1, options, [comm, bound_ms](Impl* m) {
    return comm::make_nccl_transport(comm, /*owns=*/false, bounded_wait(m), bound_ms);
  });
  return made(std::move(impl));
}

std::unique_ptr<Communicator> Communicator::create(const RankContext& ctx, const CommunicatorOptions& options) {
  CommunicatorOptions o = options;
  if (o.device < 0) o.device = ctx.device;
  if (ctx.group) return create_in_process(ctx.group, ctx.rank, o);
  return create(ctx.rank, ctx.world_size, ctx.nccl_id, o);
}

std::unique_ptr<Communicator> Communicator::create_in_process(const std::shared_ptr<InProcessGroup>& group, int rank,
                                                              const CommunicatorOptions& options) {
  ASYNCTP_CHECK(group != nullptr, "Communicator::create_in_process: group is null; make one with InProcessGroup::create");
  ASYNCTP_CHECK(rank >= 0 && rank < group->world_size(), "Communicator::create_in_process: rank must be in [0, ",
                group->world_size(), "), got ", rank);
  const detail::RankScope scope(rank);
  const int device = group->device_of(rank);
  ASYNCTP_CHECK(options.device < 0 || options.device == device, "Communicator::create_in_process: options.device is ",
                options.device, " but the group runs rank ", rank, " on GPU ", device, "; leave it -1");
  // Every rank of the process sees the same mode, so every rank that shares a GPU refuses alike.
  const int sharing = group->ranks_on_device(device);
  ASYNCTP_CHECK(sharing <= 1 || !detail::lazy_module_loading(), "Communicator::create_in_process: ", sharing,
                " ranks share GPU ", device, " but CUDA loads kernels lazily (CUDA_MODULE_LOADING is LAZY or was unset "
                "at the process's first CUDA call): a kernel loaded at its first launch can wait for the GPU to go "
                "idle, which it does not while a peer's fused kernel waits for this rank, and the call times out; "
                "expected CUDA_MODULE_LOADING=EAGER set before the first CUDA call (asynctp::launch with "
                "LaunchOptions::in_process sets it where it is unset)");
  auto impl = make_impl(rank, device, sharing, options, [&group, rank](Impl* m) {
    const kernels::WaitContext ctx{m->fault, static_cast<uint64_t>(m->timeout_ms) * 1000000ull, rank};
    return comm::make_in_process_transport(group, rank, m->timeout_ms, ctx);
  });
  return made(std::move(impl));
}

std::unique_ptr<Communicator> Communicator::made(std::unique_ptr<Impl> impl) {
  const int rank = impl->rank;
  std::unique_ptr<Communicator> comm(new Communicator(std::move(impl)));
  detail::set_thread_rank(rank);  // only now: a creation that failed leaves no rank behind
  return comm;
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

  ASYNCTP_CUDA_CHECK(cudaEventCreateWithFlags(&m.last_call_end, cudaEventDisableTiming));
  ASYNCTP_CUBLAS_CHECK(cublasLtCreate(&m.cublaslt));
  open_mailbox(m);

  ASYNCTP_CHECK(m.lsa.size >= 1, "Communicator: the transport reports an empty LSA team");
  m.signals = SignalPad::create(*this, m.signal_count);
  m.barrier_pad = SignalPad::create(*this, m.lsa.size);
  ASYNCTP_CUDA_CHECK(cudaMalloc(&m.barrier_epoch, sizeof(uint32_t)));
  ASYNCTP_CUDA_CHECK(cudaMemsetAsync(m.barrier_epoch, 0, sizeof(uint32_t), m.setup_stream));
  ASYNCTP_CUDA_CHECK(cudaStreamSynchronize(m.setup_stream));
  // Only a transport whose kernels can wait without bound needs one: asynctp's own waits end
  // themselves (in-process, every wait is asynctp's).
  if (m.transport->collectives_unbounded() && detail::knob_word(detail::Knob::kWatchdog) != 1) {
    // The transport ends the kernels it may; the caller's callback, on a thread of its own (an abort
    // can block for good), those of an NCCL communicator it owns.
    m.watchdog = std::make_unique<comm::Watchdog>(m.device, m.rank, m.timeout_ms,
                                                  [t = m.transport.get(), user = m.on_overdue] {
                                                    t->stop_kernels();
                                                    if (user) std::thread(user).detach();
                                                  });
  }
}

Communicator::~Communicator() {
  Impl& m = *impl_;
  const detail::RankScope scope(impl_->rank);
  cudaSetDevice(m.device);
  // After a kernel trapped (a wait timed out) the context is gone, and a broken communicator may have
  // peers that are gone or an NCCL kernel that still waits: collective teardown could hang, and so
  // could cudaFree (it waits for the device). The resources are then left to the dying process.
  const bool healthy = m.broken.empty() && cudaDeviceSynchronize() == cudaSuccess;
  // What the layers above keep here goes first: it holds symmetric buffers, streams and GEMM plans
  // made on this communicator.
  for (auto it = m.attachments.rbegin(); it != m.attachments.rend(); ++it) it->second->detach(healthy);
  m.attachments.clear();
  if (healthy) {
    m.workspace.reset();
    m.retired_buffers.clear();
    for (void* p : m.retired_scratch) cudaFree(p);
    m.barrier_pad.reset();
    m.signals.reset();
    cudaFree(m.barrier_epoch);
    if (m.scratch) cudaFree(m.scratch);
  } else {
    (void)m.workspace.release();
    for (auto& b : m.retired_buffers) (void)b.release();
    (void)m.barrier_pad.release();
    (void)m.signals.release();
  }
  // Last of what can wait on the GPU is done: the watchdog has bounded it (it ends a stuck call, and
  // the waits above fail instead of hanging).
  m.watchdog.reset();
  if (m.cublaslt) cublasLtDestroy(m.cublaslt);
  if (m.setup_stream) cudaStreamDestroy(m.setup_stream);
  if (m.last_call_end) cudaEventDestroy(m.last_call_end);
  m.transport->shutdown(healthy);
}

int Communicator::rank() const { return impl_->rank; }
int Communicator::world_size() const { return impl_->world_size; }
int Communicator::device() const { return impl_->device; }
int Communicator::timeout_ms() const { return impl_->timeout_ms; }
Team Communicator::lsa() const { return impl_->lsa; }
ncclComm_t Communicator::nccl() const { return impl_->transport->nccl(); }
const char* Communicator::transport_name() const { return impl_->transport->name(); }
int Communicator::sm_budget() const { return impl_->sm_budget; }
cublasLtContext* Communicator::cublaslt() const { return impl_->cublaslt; }
SignalPad& Communicator::signals() { return *impl_->signals; }

int Communicator::lsa_to_world(int lsa_rank) const {
  const detail::RankScope scope(impl_->rank);
  ASYNCTP_CHECK(lsa_rank >= 0 && lsa_rank < impl_->lsa.size, "lsa_to_world: lsa_rank must be in [0, ",
                impl_->lsa.size, "), got ", lsa_rank);
  return impl_->transport->lsa_to_world(lsa_rank);
}

SymmetricBuffer& Communicator::workspace(size_t bytes) {
  const detail::RankScope scope(impl_->rank);
  impl_->require_usable("Communicator::workspace");
  ASYNCTP_CHECK(bytes > 0, "Communicator::workspace: bytes must be > 0");
  if (!impl_->workspace || impl_->workspace->size() < bytes) {
    // Grow geometrically so a sequence of slightly larger requests does not reallocate every time.
    size_t grown = impl_->workspace ? impl_->workspace->size() : 0;
    grown = std::max(bytes, grown + grown / 2);
    impl_->retire(std::move(impl_->workspace));
    impl_->workspace = SymmetricBuffer::create(*this, grown);
  }
  return *impl_->workspace;
}

void Communicator::synchronize(cudaStream_t stream) const {
  const detail::RankScope scope(impl_->rank);
  // Twice the device-side bound, so a kernel's own timeout report (which names the flag and the
  // peer) arrives before this host-side one.
  impl_->wait_bounded(stream, 2 * static_cast<int64_t>(impl_->timeout_ms), "Communicator::synchronize");
}

bool Communicator::all_ok(bool local_ok) {
  const detail::RankScope scope(impl_->rank);
  return impl_->failing_ranks(local_ok).empty();
}

void Communicator::require_hopper(const char* what) const {
  const detail::RankScope scope(impl_->rank);
  check_hopper(impl_->cc_major, impl_->cc_minor, impl_->gpu_name.c_str(), impl_->device, what);
}

uint64_t timeout_ns(const Communicator& comm) { return static_cast<uint64_t>(comm.timeout_ms()) * 1000000ull; }

}  // namespace asynctp
