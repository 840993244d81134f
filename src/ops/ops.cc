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
#include "ops/op_steps.h"
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

using ops::NamedInputs;
using ops::agree;
using ops::check_not_in_workspace;
using ops::check_on_this_gpu;
using ops::check_runs_here;
using ops::choose;
using ops::note_capture;
using ops::unless_refused;

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
  for (size_t i = 0; i < bs.size(); ++i) inputs.emplace_back(detail::ArgName("bs", static_cast<long long>(i)), bs[i]);

  std::string refusal;
  ops::AllGatherMatmulPlan plan;
  unless_refused(refusal, [&] {
    plan = ops::plan_all_gather_matmul(comm.world_size(), a_shard, bs, gather_dim, outputs, gathered_a, requested);
    NamedInputs all = inputs;
    for (size_t i = 0; i < outputs.size(); ++i) all.emplace_back(detail::ArgName("outputs", static_cast<long long>(i)), outputs[i]);
    all.emplace_back("gathered_a", gathered_a);
    if (requested.check_pointers) check_on_this_gpu(comm, op, all);
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
    if (requested.check_pointers) check_on_this_gpu(comm, op, all);
    check_not_in_workspace(comm, op, all);
  });
  const OpOptions options = choose(comm, requested, refusal,
                                   [&] { return tune::key_of(plan, comm.world_size(), impl_of(comm).gpu_name); });
  unless_refused(refusal, [&] { check_runs_here(comm, op, options.algorithm); });

  ops::Signature signature = ops::signature_of(op, a, {b}, scatter_dim, options, static_cast<int64_t>(reduce_op));
  if (options.algorithm == Algorithm::kFused) add_fused_rs_fields(signature, comm);
  const algo::AgreeFn agreed =
      agree(comm, op, std::move(signature), options, stream, refusal, NamedInputs{{"a", a}, {"b", b}});
  ops::run_matmul_reduce_scatter(comm, plan, options.algorithm, options.chunks_per_rank, a, b, output, stream, agreed);
}

}  // namespace asynctp
