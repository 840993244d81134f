// Internal: the steps every public op takes (ops.cc, scaled_ops.cc): refusals carried to the
// agreement, auto made concrete, the agreement across ranks, and the checks of where tensors live.
#pragma once

#include <string>

#include "algo/sequential.h"
#include "asynctp/error.h"
#include "asynctp/ops.h"
#include "comm/communicator_impl.h"
#include "ops/nonfinite.h"
#include "ops/plan.h"
#include "tune/resolve.h"

namespace asynctp::ops {


// Runs `step` of this rank's checks where nothing was refused yet, keeping its refusal: a refusal must
// go through the agreement, so that every rank fails together.
template <typename Step>
void unless_refused(std::string& refusal, Step step) {
  if (!refusal.empty()) return;
  try {
    step();
  } catch (const Error& e) {
    refusal = e.what();
  }
}

// kAuto made concrete for the planned call `key_fn()` describes; where this rank refused (or the
// tuning cache cannot be read, which refuses it), sequential, which the refusal names.
template <typename KeyFn>
OpOptions choose(Communicator& comm, const OpOptions& requested, std::string& refusal, KeyFn key_fn) {
  OpOptions options = requested;
  if (options.algorithm != Algorithm::kAuto) return options;
  options.algorithm = Algorithm::kSequential;
  options.chunks_per_rank = 0;
  unless_refused(refusal, [&] { options = tune::resolve(comm, key_fn(), requested); });
  return options;
}

// Agreement across ranks. Under ASYNCTP_CHECK_NAN=1 `inputs` are scanned for NaN and Inf first. Where
// this rank refuses and ranks check each other, the refusal is shared first (so every rank fails
// together) and thrown; otherwise the cross-rank check is returned for the algorithm to run just
// before its first communication.
algo::AgreeFn agree(Communicator& comm, const char* op, Signature signature, const OpOptions& options,
                    cudaStream_t stream, std::string refusal, const NamedInputs& inputs);

// What a fused reduce-scatter's ranks must have alike beyond the call's arguments: whether it runs
// pipelined (one hardware queue: algo::fused_rs_unsupported), and the SMs its kernel may use, which
// the way of reducing and the tiles' width, and so the staged layout, follow (algo::fused_rs_tile_n).
void add_fused_rs_fields(Signature& signature, const Communicator& comm);

// A call captured in a CUDA graph may be replayed at any time later: from then on the communicator
// keeps what it outgrows instead of freeing it (Communicator::Impl::graphs_captured).
void note_capture(Communicator& comm, const Communicator::Impl::OrderedCall& call);

// Every tensor must be memory this rank's GPU addresses as its own: device memory of that GPU, or
// managed memory. Host memory (pinned or not) and another GPU's memory would fault in a kernel or be
// read across PCIe unnoticed; they are refused by name (inside the plan, so on every rank together).
void check_on_this_gpu(const Communicator& comm, const char* op, const NamedInputs& tensors);

// The communicator's workspace (Communicator::workspace()) is the ops' own: the algorithms gather and
// stage there, so a tensor in it would be overwritten, or read while being written. Refused by name,
// inside the plan (so on every rank together).
void check_not_in_workspace(const Communicator& comm, const char* op, const NamedInputs& tensors);

// Where the algorithm cannot run on these GPUs, a refusal like a bad argument's (so that it goes
// through the agreement and every rank fails together): pipelined and fused need every rank to reach
// every other's memory, and fused a Hopper GPU.
void check_runs_here(Communicator& comm, const char* op, Algorithm algorithm);

}  // namespace asynctp::ops
