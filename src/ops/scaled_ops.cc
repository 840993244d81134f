// The scaled ops (asynctp/scaled_ops.h), on the path the unscaled ones take (ops.cc): plan, choose,
// agree, dispatch.
#include "asynctp/scaled_ops.h"

#include <string>
#include <utility>
#include <vector>

#include "common/check.h"
#include "kernels/fused/tile_trace.h"
#include "ops/dispatch.h"
#include "ops/op_steps.h"

namespace asynctp {
namespace {

// kAuto made concrete as for the unscaled ops (ops::choose), from the planned call's key.
template <typename KeyFn>
ScaledOpOptions chosen(Communicator& comm, const ScaledOpOptions& requested, std::string& refusal, KeyFn key_fn) {
  ScaledOpOptions options = requested;
  static_cast<OpOptions&>(options) = ops::choose(comm, requested, refusal, key_fn);
  if (options.algorithm == Algorithm::kSequential) options.chunks_per_rank = 0;
  return options;
}

// What the scaled ops add to the ranks' signature.
void add_scaling(ops::Signature& s, const algo::Scaling& scaling) {
  s.add("B's dtype", static_cast<int64_t>(scaling.b_dtype));
  s.add("output dtype", static_cast<int64_t>(scaling.out_dtype));
  s.add("row-wise scales", scaling.rowwise ? 1 : 0);
  // A rank that gathers its a_scale takes part in a collective the others would not.
  s.add("a_scale gathered with A's rows", scaling.gather_a_scale ? 1 : 0);
  s.add("use_fast_accum", scaling.fast_accum ? 1 : 0);
  // A bias on some ranks only is refused on all of them.
  s.add("bias", scaling.bias ? 1 : 0);
}

}  // namespace

void all_gather_scaled_matmul(Communicator& comm, const TensorRef& a_shard, const std::vector<TensorRef>& bs,
                              const TensorRef& a_scale, const std::vector<TensorRef>& b_scales, int gather_dim,
                              const std::vector<TensorRef>& outputs, const TensorRef& gathered_a, cudaStream_t stream,
                              const ScaledOpOptions& requested, const std::vector<TensorRef>& biases,
                              const std::vector<TensorRef>& result_scales) {
  const char* op = "all_gather_scaled_matmul";
  const detail::RankScope scope(comm.rank());
  const Communicator::Impl::OrderedCall ordered(impl_of(comm), stream, op);
  kernels::fused::CallTimeline::note_op_entry();
  ops::note_capture(comm, ordered);

  std::string refusal;
  algo::AllGatherMatmulPlan plan;
  std::vector<algo::ScaledEpilogue> epilogues;
  ops::unless_refused(refusal, [&] {
    epilogues = ops::scaled_epilogues(op, bs.size(), biases, result_scales);
    plan = ops::plan_all_gather_scaled_matmul(comm.world_size(), a_shard, bs, a_scale, b_scales, gather_dim, outputs,
                                              gathered_a, epilogues, requested);
    ops::NamedInputs all{{"a_shard", a_shard}, {"a_scale", a_scale}, {"gathered_a", gathered_a}};
    for (size_t i = 0; i < bs.size(); ++i) {
      const auto i_ll = static_cast<long long>(i);
      all.emplace_back(detail::ArgName("bs", i_ll), bs[i]);
      all.emplace_back(detail::ArgName("b_scales", i_ll), b_scales[i]);
      all.emplace_back(detail::ArgName("outputs", i_ll), outputs[i]);
      all.emplace_back(detail::ArgName("biases", i_ll), epilogues[i].bias);
      all.emplace_back(detail::ArgName("result_scales", i_ll), epilogues[i].result_scale);
    }
    if (requested.check_pointers) ops::check_on_this_gpu(comm, op, all);
    ops::check_not_in_workspace(comm, op, all);
  });
  const ScaledOpOptions options =
      chosen(comm, requested, refusal, [&] { return tune::key_of(plan, comm.world_size(), impl_of(comm).gpu_name); });
  ops::unless_refused(refusal, [&] { ops::check_runs_here(comm, op, options.algorithm); });
  ops::Signature signature = ops::signature_of(op, a_shard, bs, gather_dim, options, gathered_a.defined() ? 1 : 0);
  add_scaling(signature, plan.scaling);
  // The NaN scan (ASYNCTP_CHECK_NAN) reads 16-bit inputs; fp8 ones are not scanned.
  const algo::AgreeFn agreed = ops::agree(comm, op, std::move(signature), options, stream, refusal, {});
  ops::run_all_gather_scaled_matmul(comm, plan, options.algorithm, options.chunks_per_rank, a_shard, bs, a_scale, b_scales,
                                    outputs, gathered_a, epilogues, stream, agreed);
}

void scaled_matmul_reduce_scatter(Communicator& comm, const TensorRef& a, const TensorRef& b, const TensorRef& a_scale,
                                  const TensorRef& b_scale, int scatter_dim, ReduceOp reduce_op,
                                  const TensorRef& output, cudaStream_t stream, const ScaledOpOptions& requested,
                                  const TensorRef& bias, const TensorRef& result_scale) {
  const char* op = "scaled_matmul_reduce_scatter";
  const detail::RankScope scope(comm.rank());
  const Communicator::Impl::OrderedCall ordered(impl_of(comm), stream, op);
  kernels::fused::CallTimeline::note_op_entry();
  ops::note_capture(comm, ordered);

  std::string refusal;
  algo::MatmulReduceScatterPlan plan;
  const algo::ScaledEpilogue epilogue{bias, result_scale};
  ops::unless_refused(refusal, [&] {
    plan = ops::plan_scaled_matmul_reduce_scatter(comm.world_size(), a, b, a_scale, b_scale, scatter_dim, reduce_op,
                                                  output, epilogue, requested);
    const ops::NamedInputs all{{"a", a},           {"b", b},       {"a_scale", a_scale}, {"b_scale", b_scale},
                               {"output", output}, {"bias", bias}, {"result_scale", result_scale}};
    if (requested.check_pointers) ops::check_on_this_gpu(comm, op, all);
    ops::check_not_in_workspace(comm, op, all);
  });
  const ScaledOpOptions options =
      chosen(comm, requested, refusal, [&] { return tune::key_of(plan, comm.world_size(), impl_of(comm).gpu_name); });
  ops::unless_refused(refusal, [&] { ops::check_runs_here(comm, op, options.algorithm); });
  ops::Signature signature = ops::signature_of(op, a, {b}, scatter_dim, options, static_cast<int64_t>(reduce_op));
  add_scaling(signature, plan.scaling);
  if (options.algorithm == Algorithm::kFused) ops::add_fused_rs_fields(signature, comm);
  const algo::AgreeFn agreed = ops::agree(comm, op, std::move(signature), options, stream, refusal, {});
  ops::run_scaled_matmul_reduce_scatter(comm, plan, options.algorithm, options.chunks_per_rank, a, b, a_scale, b_scale,
                                        output, epilogue, stream, agreed);
}

}  // namespace asynctp
