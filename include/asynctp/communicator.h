// Communicator: one rank's handle on the GPUs of a tensor-parallel group.
//
// It reaches the other ranks through NCCL (a communicator it owns or borrows: real use, one process per
// GPU) or, for tests and development on fewer GPUs than ranks, as a thread of an in-process group
// (asynctp/in_process.h), and holds what every asynctp op needs: a cuBLASLt handle, the LSA team (the
// ranks whose memory this GPU reaches by load/store over NVLink or PCIe), a signal pad, a
// stream-ordered barrier and a symmetric workspace that grows on demand.
//
// Creation, destruction, workspace() and barrier() are collective: every rank of the group calls them,
// in the same order. Creation is refused with an asynctp::Error on every rank when the NCCL library
// differs from the headers asynctp was built with, or when a peer of the LSA team has no P2P access.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

struct cublasLtContext;  // cublasLtHandle_t, without pulling cublasLt.h into every user

namespace asynctp {

namespace detail {
struct CommunicatorAccess;
}  // namespace detail

class SymmetricBuffer;
class SignalPad;

struct CommunicatorOptions {
  // CUDA device of this rank; -1 means the device current on the calling thread.
  int device = -1;
  // Bound on every wait asynctp does on the GPU; <= 0 means ASYNCTP_TIMEOUT_MS from the environment,
  // else 30 s. A wait that passes it reports rank, flag and values and stops the kernel (trap).
  int timeout_ms = 0;
  // Flags in the communicator's signal pad (signals()).
  int signal_count = 1024;
  // Algorithm::kAuto's tuning cache (JSON Lines written by asynctp-tune, docs/design/auto.md), read on top of
  // the one built into the library. Empty: $ASYNCTP_TUNING_CACHE where set, else the built-in one only.
  std::string tuning_cache;
  // SMs each of this rank's persistent (fused) kernels may use, rounded down to whole 2-SM clusters.
  // 0: the whole GPU, or where ranks of an in-process group share a GPU, an equal share that leaves 2
  // SMs per rank for the small wait and copy kernels (every rank's persistent kernel must be resident
  // at once, or one waits for a peer kernel that cannot be placed). A caller that keeps SMs for work on
  // another stream sets it too.
  int sm_budget = 0;
  // Called once, on a thread of its own, when one of this communicator's calls is overdue on the GPU
  // (docs/design/reliability.md, "watchdog"), after the report is recorded and the CUDA context put
  // in error. Where the NCCL communicator was given to wrap(), asynctp does not abort it: this is
  // where its owner does (PyTorch: ProcessGroup.abort()), so that an NCCL kernel waiting on a peer
  // that is gone ends. Must not call into this Communicator.
  std::function<void()> on_overdue;
};

class InProcessGroup;
class RankContext;

// The LSA ("load/store accessible") team: ranks that can read each other's symmetric memory directly.
struct Team {
  int rank = 0;  // this rank's index in the team
  int size = 1;
};

class Communicator {
 public:
  // Makes and owns an NCCL communicator (ncclCommInitRank). Collective.
  static std::unique_ptr<Communicator> create(int rank, int world_size, const ncclUniqueId& id,
                                              const CommunicatorOptions& options = {});
  // Uses `comm`, which the caller owns and must keep alive until this Communicator is destroyed.
  static std::unique_ptr<Communicator> wrap(ncclComm_t comm, const CommunicatorOptions& options = {});
  // The communicator of a rank started by launch(): NCCL with ctx.nccl_id, or ctx.group's in-process
  // transport where the ranks are threads (LaunchOptions::in_process). options.device defaults to
  // ctx.device. Collective.
  static std::unique_ptr<Communicator> create(const RankContext& ctx, const CommunicatorOptions& options = {});
  // Rank `rank` of an in-process group (asynctp/in_process.h): the ranks are threads of this process,
  // each calling this on a thread of its own, all at once (collective). options.device must be -1 or
  // the group's device for the rank. For running multi-rank code on fewer GPUs than ranks.
  static std::unique_ptr<Communicator> create_in_process(const std::shared_ptr<InProcessGroup>& group, int rank,
                                                         const CommunicatorOptions& options = {});

  ~Communicator();  // collective: frees windows and the device communicator in reverse order
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const;
  int world_size() const;
  int device() const;
  int timeout_ms() const;
  Team lsa() const;
  int lsa_to_world(int lsa_rank) const;  // world rank of an LSA team member

  ncclComm_t nccl() const;  // null for an in-process communicator
  const char* transport_name() const;  // "nccl" or "in-process"
  int sm_budget() const;  // CommunicatorOptions::sm_budget, resolved
  cublasLtContext* cublaslt() const;

  // This rank's flags, readable and settable from every LSA peer (see signal.h).
  SignalPad& signals();

  // A symmetric buffer of at least `bytes` bytes, reused across calls and regrown (collectively) when a
  // call needs more. Every rank must pass the same `bytes`. The reference stays valid until the next
  // call that grows it.
  SymmetricBuffer& workspace(size_t bytes);

  // Stream-ordered barrier across the LSA team: work enqueued on `stream` after it starts only once
  // every LSA rank's work before its own barrier() has finished. Bounded by timeout_ms(). Capturable in
  // a CUDA graph (its epoch lives on the GPU).
  void barrier(cudaStream_t stream);

  // Waits for `stream`, at most twice timeout_ms(). Where one of asynctp's waits on the GPU timed out,
  // throws an asynctp::Error carrying the kernel's report (which rank, which flag, what it saw); the
  // CUDA context is then lost. A call still running on the GPU 1.5 times timeout_ms() after it started
  // there (an NCCL kernel of the sequential algorithm waiting on a peer that is gone: NCCL's waits have
  // no bound of their own) is ended by the communicator's watchdog, which puts the CUDA context in
  // error and stops the transport's waiting kernels (or calls CommunicatorOptions::on_overdue), and
  // this throws its report, as any wait on the stream fails then, the caller's own included.
  // Where the stream is still busy at the bound, throws an Error saying so. Either way the
  // communicator is broken from then on (every op, barrier and workspace call throws, quoting why),
  // and the process should end (docs/design/reliability.md).
  void synchronize(cudaStream_t stream) const;

  // Collective, host-synchronous: true on every rank iff `local_ok` is true on every rank. Lets a rank
  // that found a problem make all ranks fail together instead of leaving the others in a collective.
  bool all_ok(bool local_ok);

  // Throws asynctp::Error naming `what` unless this rank's GPU is Hopper (sm_90).
  void require_hopper(const char* what) const;

  struct Impl;  // what the library holds for it (internal)

 private:
  friend struct detail::CommunicatorAccess;
  explicit Communicator(std::unique_ptr<Impl> impl);
  static std::unique_ptr<Communicator> made(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace asynctp
