// Internal: how the ranks of a communicator reach each other, the one place that knows whether that is
// NCCL (real use: one process per GPU) or threads of one process (comm/in_process_transport.h: tests
// and development on fewer GPUs than ranks). Signal pads, ops, algorithms and kernels work through
// the Communicator and never name either.
//
// What a transport provides: the team of ranks whose memory this GPU reaches by load and store;
// symmetric memory with host- and device-side peer pointers; host-synchronous exchanges of a few bytes
// (set-up, agreement, the ops' argument check); the collectives of the sequential algorithm on a
// stream; and what to do when a wait gives up.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "asynctp/communicator.h"
#include "asynctp/ops.h"
#include "asynctp/tensor.h"

namespace asynctp::comm {

// Waits for `stream` to finish, bounded; throws asynctp::Error naming `what` where it cannot.
using BoundedWait = std::function<void(cudaStream_t stream, const char* what)>;

// One rank's part of a symmetric allocation and its view of every peer's.
struct SymmetricMapping {
  void* local = nullptr;
  size_t bytes = 0;
  std::vector<void*> peers;     // by LSA rank, valid in this process (copy engine and kernels)
  void** device_peers = nullptr;  // the same, in device memory
  ncclWindow_t window = nullptr;  // NCCL's window; null for other transports
};

class Transport {
 public:
  virtual ~Transport() = default;

  virtual const char* name() const = 0;  // "nccl" or "in-process"
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual int device() const = 0;
  virtual Team lsa() const = 0;
  virtual int lsa_to_world(int lsa_rank) const = 0;
  // The NCCL communicator, or null where the transport has none.
  virtual ncclComm_t nccl() const { return nullptr; }

  // Collective and host-synchronous: every rank's `mine` (the same size on every rank), by rank.
  virtual std::vector<std::string> exchange(const std::string& mine, const char* what) = 0;

  // Collective: `bytes` (rounded up to alignment()) of zeroed memory on every rank, and the peers' views.
  virtual size_t alignment() const = 0;
  virtual SymmetricMapping map_symmetric(size_t bytes) = 0;
  // Frees this rank's part. The caller has made sure that no rank can still reach it.
  virtual void unmap_symmetric(SymmetricMapping& mapping) = 0;

  // The sequential algorithm's collectives, enqueued on `stream`. all_gather: `bytes` from every
  // rank, by rank, into recv. reduce_scatter: `count` elements of send's rank-th block from every
  // rank, summed (or averaged) into recv.
  virtual void all_gather(const void* send, void* recv, size_t bytes, cudaStream_t stream) = 0;
  virtual void reduce_scatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                              cudaStream_t stream) = 0;
  // Whether those collectives' kernels wait on the peers without a bound of their own (NCCL's).
  virtual bool collectives_unbounded() const { return false; }

  // Collective where the ranks are threads of one process: returns once every rank has reached it, so
  // that set-up which can wait for the GPU (allocating, freeing, first uses) has ended on every rank
  // before any rank enqueues work that waits for a peer (docs/design/transport.md, "Ranks that share a
  // GPU"). Nothing to do where each rank is a process of its own.
  virtual void settle(const char* /*what*/) {}

  // Whether the ranks are threads of this process (then a kernel's first load can wait for every GPU
  // of the process: Communicator::Impl::quiesce).
  virtual bool ranks_in_one_process() const { return false; }

  // An error a peer or the transport reported asynchronously, to end a host wait with; "" if none.
  virtual std::string async_error() = 0;
  // The communicator is broken (`why`). kernels_may_wait: a kernel of the transport's may still wait
  // on a peer that is gone. Returns what became of the transport, as a clause for an error message.
  virtual std::string abandon(const std::string& why, bool kernels_may_wait) = 0;
  // From the watchdog's thread (comm/watchdog.h), once a call is overdue: makes the transport's own
  // kernels that still wait on a peer end, where it can. Does not wait for them.
  virtual void stop_kernels() {}
  // Frees the transport's resources on the device; `healthy`: every rank is here and the GPU drained.
  virtual void shutdown(bool healthy) = 0;
};

}  // namespace asynctp::comm
