#include "ops/op_steps.h"

#include <utility>

#include "algo/pipelined.h"
#include "asynctp/communicator.h"
#include "asynctp/version.h"
#include "common/check.h"
#include "common/env.h"
#include "ops/cross_rank_check.h"

namespace asynctp::ops {

algo::AgreeFn agree(Communicator& comm, const char* op, Signature signature, const OpOptions& options,
                    cudaStream_t stream, std::string refusal, const NamedInputs& inputs) {
  if (refusal.empty() && impl_of(comm).check_nonfinite) refusal = describe_nonfinite(comm, op, inputs, stream);
  if (!refusal.empty()) {
    if (options.check_across_ranks) agree_across_ranks(comm, op, signature, refusal, stream);
    throw Error(refusal);
  }
  // One rank has no peer to compare with.
  if (!options.check_across_ranks || impl_of(comm).world_size == 1) return [] {};
  // Threads of one process agree first: a GEMM's first launch there is a host exchange of every rank
  // (Communicator::Impl::quiesce), which a peer already waiting in the agreement would never reach.
  if (impl_of(comm).transport->ranks_in_one_process()) {
    agree_across_ranks(comm, op, signature, std::string(), stream);
    return [] {};
  }
  return [&comm, op, signature = std::move(signature), stream] {
    agree_across_ranks(comm, op, signature, std::string(), stream);
  };
}

void add_fused_rs_fields(Signature& signature, const Communicator& comm) {
  signature.add("one hardware queue per device (CUDA_DEVICE_MAX_CONNECTIONS=1)", detail::one_device_connection() ? 1 : 0);
  signature.add("the fused kernel's SMs (CommunicatorOptions::sm_budget)", impl_of(comm).sm_budget);
}

void note_capture(Communicator& comm, const Communicator::Impl::OrderedCall& call) {
  if (call.captured()) impl_of(comm).graphs_captured = true;
}

void check_on_this_gpu(const Communicator& comm, const char* op, const NamedInputs& tensors) {
  for (const auto& [name, t] : tensors) {
    if (!t.defined()) continue;
    cudaPointerAttributes attr{};
    const cudaError_t e = cudaPointerGetAttributes(&attr, t.data);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      detail::raise(detail::cat(op, ": ", name, " (", t.data, ") is not memory CUDA knows (", cudaGetErrorString(e),
                                "); expected device memory of this rank's GPU ", comm.device()));
    }
    if (attr.type == cudaMemoryTypeManaged) continue;
    ASYNCTP_CHECK(attr.type == cudaMemoryTypeDevice, op, ": ", name, " is ",
                  attr.type == cudaMemoryTypeHost ? "pinned host memory" : "host memory",
                  "; expected device memory of this rank's GPU ", comm.device());
    ASYNCTP_CHECK(attr.device == comm.device(), op, ": ", name, " is memory of GPU ", attr.device,
                  "; expected memory of this rank's GPU ", comm.device());
  }
}

void check_not_in_workspace(const Communicator& comm, const char* op, const NamedInputs& tensors) {
  const SymmetricBuffer* ws = impl_of(comm).workspace.get();
  if (ws == nullptr) return;
  const auto* lo = static_cast<const char*>(ws->local());
  const auto* hi = lo + ws->size();
  for (const auto& [name, t] : tensors) {
    if (!t.defined()) continue;
    const auto* begin = static_cast<const char*>(t.data);
    ASYNCTP_CHECK(begin + t.bytes() <= lo || begin >= hi, op, ": ", name,
                  " lies in this communicator's workspace (Communicator::workspace()), which the op itself writes; "
                  "pass memory of your own (a SymmetricBuffer of your own for a shard to be read in place)");
  }
}

void check_runs_here(Communicator& comm, const char* op, Algorithm algorithm) {
  if (algorithm == Algorithm::kPipelined || algorithm == Algorithm::kFused) algo::require_one_node(comm, op);
  const Communicator::Impl& m = impl_of(comm);
  if (algorithm == Algorithm::kFused && !is_hopper(m.cc_major, m.cc_minor)) {
    comm.require_hopper(detail::cat(op, " with algorithm 'fused'").c_str());
  }
}

}  // namespace asynctp::ops
