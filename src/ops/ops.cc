// The public ops: plan, choose, agree across ranks, dispatch.
#include "asynctp/ops.h"

#include <string>
#include <utility>
#include <vector>

#include "algo/pipelined.h"
#include "algo/sequential.h"
#include "asynctp/communicator.h"
#include "asynctp/error.h"
#include "asynctp/version.h"
#include "comm/communicator_impl.h"
#include "common/check.h"
#include "common/env.h"
#include "kernels/fused/tile_trace.h"
#include "ops/cross_rank_check.h"
#include "ops/dispatch.h"
#include "ops/nonfinite.h"
#include "ops/plan.h"
#include "tune/resolve.h"

namespace asynctp {

const char* algorithm_name(Algorithm algorithm) {
  switch (algorithm) {
    case Algorithm::kSequential: return "sequential";
    case Algorithm::kPipelined: return "pipelined";
    case Algorithm::kFused: return "fused";
    case Algorithm::kAuto: return "auto";
  }
  return "unknown";
}

namespace {

using ops::NamedInputs;

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
algo::AgreeFn agree(Communicator& comm, const char* op, ops::Signature signature, const OpOptions& options,
                    cudaStream_t stream, std::string refusal, const NamedInputs& inputs) {
  if (refusal.empty() && impl_of(comm).check_nonfinite) refusal = ops::describe_nonfinite(comm, op, inputs, stream);
  if (!refusal.empty()) {
    if (options.check_across_ranks) ops::agree_across_ranks(comm, op, signature, refusal, stream);
    throw Error(refusal);
  }
  if (!options.check_across_ranks) return [] {};
  // Threads of one process agree first: a GEMM's first launch there is a host exchange of every rank
  // (Communicator::Impl::quiesce), which a peer already waiting in the agreement would never reach.
  if (impl_of(comm).transport->ranks_in_one_process()) {
    ops::agree_across_ranks(comm, op, signature, std::string(), stream);
    return [] {};
  }
  return [&comm, op, signature = std::move(signature), stream] {
    ops::agree_across_ranks(comm, op, signature, std::string(), stream);
  };
}

// A call captured in a CUDA graph may be replayed at any time later: from then on the communicator
// keeps what it outgrows instead of freeing it (Communicator::Impl::graphs_captured).
void note_capture(Communicator& comm, const Communicator::Impl::OrderedCall& call) {
  if (call.captured()) impl_of(comm).graphs_captured = true;
}

// Every tensor must be memory this rank's GPU addresses as its own: device memory of that GPU, or
// managed memory. Host memory (pinned or not) and another GPU's memory would fault in a kernel or be
// read across PCIe unnoticed; they are refused by name (inside the plan, so on every rank together).
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

// The communicator's workspace (Communicator::workspace()) is the ops' own: the algorithms gather and
// stage there, so a tensor in it would be overwritten, or read while being written. Refused by name,
// inside the plan (so on every rank together).
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

// Where the algorithm cannot run on these GPUs, a refusal like a bad argument's (so that it goes
// through the agreement and every rank fails together): pipelined and fused need every rank to reach
// every other's memory, and fused a Hopper GPU.
void check_runs_here(Communicator& comm, const char* op, Algorithm algorithm) {
  if (algorithm == Algorithm::kPipelined || algorithm == Algorithm::kFused) algo::require_one_node(comm, op);
  const Communicator::Impl& m = impl_of(comm);
  if (algorithm == Algorithm::kFused && !is_hopper(m.cc_major, m.cc_minor)) {
    comm.require_hopper(detail::cat(op, " with algorithm 'fused'").c_str());
  }
}

}  // namespace

// Each op: plan (this rank's arguments validated and its shapes parsed, once) -> choose (kAuto made
// concrete from the plan) -> agree across ranks -> dispatch (ops/dispatch.h). A refusal at any step
// before the agreement is carried to it.
void all_gather_matmul(Communicator& comm, const TensorRef& a_shard, const std::vector<TensorRef>& bs, int gather_dim,
                       const std::vector<TensorRef>& outputs, const TensorRef& gathered_a, cudaStream_t stream,
                       const OpOptions& requested) {
  const char* op = "all_gather_matmul";
  const detail::RankScope scope(comm.rank());
  const Communicator::Impl::OrderedCall ordered(impl_of(comm), stream, op);
  kernels::fused::CallTimeline::note_op_entry();
  note_capture(comm, ordered);
  NamedInputs inputs{{"a_shard", a_shard}};
  for (size_t i = 0; i < bs.size(); ++i) inputs.emplace_back(detail::cat("bs[", i, "]"), bs[i]);

  std::string refusal;
  ops::AllGatherMatmulPlan plan;
  unless_refused(refusal, [&] {
    plan = ops::plan_all_gather_matmul(comm.world_size(), a_shard, bs, gather_dim, outputs, gathered_a, requested);
    NamedInputs all = inputs;
    for (size_t i = 0; i < outputs.size(); ++i) all.emplace_back(detail::cat("outputs[", i, "]"), outputs[i]);
    all.emplace_back("gathered_a", gathered_a);
    check_on_this_gpu(comm, op, all);
    check_not_in_workspace(comm, op, all);
  });
  const OpOptions options = choose(comm, requested, refusal,
                                   [&] { return tune::key_of(plan, comm.world_size(), impl_of(comm).gpu_name); });
  unless_refused(refusal, [&] { check_runs_here(comm, op, options.algorithm); });

  ops::Signature signature = ops::signature_of(op, a_shard, bs, gather_dim, options, gathered_a.defined() ? 1 : 0);
  // Pipelined: peers read a shard in symmetric memory in place, so every rank must keep it at the same
  // offset. Looked up only where the tensor is well formed enough to measure.
  const SymmetricBuffer* a_symmetric = nullptr;
  if (options.algorithm == Algorithm::kPipelined || options.algorithm == Algorithm::kFused) {
    const bool well_formed = a_shard.data != nullptr && a_shard.ndim > 0 && a_shard.ndim <= TensorRef::kMaxDims;
    a_symmetric = well_formed ? impl_of(comm).find_symmetric(a_shard.data, a_shard.bytes()) : nullptr;
    signature.add("a_shard's symmetric buffer (0: none)", a_symmetric ? static_cast<int64_t>(a_symmetric->serial()) : 0);
    signature.add("a_shard's offset in symmetric memory (-1: none)",
                  a_symmetric ? static_cast<const char*>(a_shard.data) - static_cast<const char*>(a_symmetric->local())
                              : -1);
  }
  const algo::AgreeFn agreed = agree(comm, op, std::move(signature), options, stream, refusal, inputs);
  ops::run_all_gather_matmul(comm, plan, options.algorithm, options.chunks_per_rank, a_shard, a_symmetric, bs, outputs,
                             gathered_a, stream, agreed);
}

void matmul_reduce_scatter(Communicator& comm, const TensorRef& a, const TensorRef& b, int scatter_dim,
                           ReduceOp reduce_op, const TensorRef& output, cudaStream_t stream, const OpOptions& requested) {
  const char* op = "matmul_reduce_scatter";
  const detail::RankScope scope(comm.rank());
  const Communicator::Impl::OrderedCall ordered(impl_of(comm), stream, op);
  kernels::fused::CallTimeline::note_op_entry();
  note_capture(comm, ordered);

  std::string refusal;
  ops::MatmulReduceScatterPlan plan;
  unless_refused(refusal, [&] {
    plan = ops::plan_matmul_reduce_scatter(comm.world_size(), a, b, scatter_dim, reduce_op, output, requested);
    const NamedInputs all{{"a", a}, {"b", b}, {"output", output}};
    check_on_this_gpu(comm, op, all);
    check_not_in_workspace(comm, op, all);
  });
  const OpOptions options = choose(comm, requested, refusal,
                                   [&] { return tune::key_of(plan, comm.world_size(), impl_of(comm).gpu_name); });
  unless_refused(refusal, [&] { check_runs_here(comm, op, options.algorithm); });

  ops::Signature signature = ops::signature_of(op, a, {b}, scatter_dim, options, static_cast<int64_t>(reduce_op));
  // Fused runs pipelined where the device has one hardware queue (algo::fused_rs_unsupported): every
  // rank must run the same.
  if (options.algorithm == Algorithm::kFused) {
    signature.add("one hardware queue per device (CUDA_DEVICE_MAX_CONNECTIONS=1)", detail::one_device_connection() ? 1 : 0);
  }
  const algo::AgreeFn agreed =
      agree(comm, op, std::move(signature), options, stream, refusal, NamedInputs{{"a", a}, {"b", b}});
  ops::run_matmul_reduce_scatter(comm, plan, options.algorithm, options.chunks_per_rank, a, b, output, stream, agreed);
}

}  // namespace asynctp
