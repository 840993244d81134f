#include "ops/dispatch.h"

#include <exception>
#include <string>

#include "algo/fused.h"
#include "algo/pipelined.h"
#include "algo/resources.h"
#include "algo/sequential.h"
#include "asynctp/error.h"
#include "comm/communicator_impl.h"
#include "common/check.h"

namespace asynctp::ops {
namespace {

// Runs an algorithm. Where it throws after its epoch began and before its protocol was complete, its
// peers wait on flags this rank will not raise and the ranks are out of step: the communicator is
// broken with the cause (every later call refuses, quoting it) and the error says so. A throw before
// the epoch began (a refusal, a growth under capture) leaves the communicator as it was.
template <typename Run>
void run_guarded(Communicator& comm, const char* op, Run run) {
  Communicator::Impl& m = impl_of(comm);
  try {
    run();
  } catch (const std::exception& e) {
    algo::Resources* r = m.find_attached<algo::Resources>();
    if (r == nullptr || r->overlap == nullptr || !r->overlap->mid_protocol()) throw;
    r->overlap->end_call();
    const std::string why = detail::cat(op, " failed after its epoch began: ", e.what());
    const std::string fate = m.abandon(why, Communicator::Impl::TransportFate::kLeave);
    throw Error(detail::cat(why, "; the peers' waits for this rank end with the timeout report, and this "
                                 "communicator can no longer be used", fate));
  }
  algo::Resources* r = m.find_attached<algo::Resources>();
  if (r != nullptr && r->overlap != nullptr) r->overlap->end_call();
}

}  // namespace

Algorithm algorithm_that_runs(const algo::AllGatherMatmulPlan& plan, Algorithm chosen) {
  if (chosen == Algorithm::kFused && plan.gather_last) return Algorithm::kPipelined;
  return chosen;
}

Algorithm algorithm_that_runs(const algo::MatmulReduceScatterPlan& plan, const TensorRef& a, const TensorRef& b,
                              const TensorRef& output, int sms, Algorithm chosen) {
  if (chosen == Algorithm::kFused && *algo::fused_rs_unsupported(plan, a, b, output, sms) != '\0') {
    return Algorithm::kPipelined;
  }
  return chosen;
}

void run_all_gather_matmul(Communicator& comm, const algo::AllGatherMatmulPlan& plan, Algorithm chosen,
                           int chunks_per_rank, const TensorRef& a_shard, const SymmetricBuffer* a_symmetric,
                           const std::vector<TensorRef>& bs, const std::vector<TensorRef>& outputs,
                           const TensorRef& gathered_a, cudaStream_t stream, const algo::AgreeFn& agree) {
  run_guarded(comm, "all_gather_matmul", [&] {
    switch (algorithm_that_runs(plan, chosen)) {
      case Algorithm::kPipelined:
        algo::pipelined_all_gather_matmul(comm, plan, a_shard, a_symmetric, bs, outputs, gathered_a, stream, agree,
                                          chunks_per_rank);
        return;
      case Algorithm::kFused:
        algo::fused_all_gather_matmul(comm, plan, a_shard, bs, outputs, gathered_a, stream, agree, chunks_per_rank);
        return;
      default:
        algo::sequential_all_gather_matmul(comm, plan, a_shard, bs, outputs, gathered_a, stream, agree);
    }
  });
}

void run_matmul_reduce_scatter(Communicator& comm, const algo::MatmulReduceScatterPlan& plan, Algorithm chosen,
                               int chunks_per_rank, const TensorRef& a, const TensorRef& b, const TensorRef& output,
                               cudaStream_t stream, const algo::AgreeFn& agree) {
  run_guarded(comm, "matmul_reduce_scatter", [&] {
    switch (algorithm_that_runs(plan, a, b, output, impl_of(comm).sm_budget, chosen)) {
      case Algorithm::kPipelined:
        algo::pipelined_matmul_reduce_scatter(comm, plan, a, b, output, stream, agree, chunks_per_rank);
        return;
      case Algorithm::kFused:
        algo::fused_matmul_reduce_scatter(comm, plan, a, b, output, stream, agree, chunks_per_rank);
        return;
      default:
        algo::sequential_matmul_reduce_scatter(comm, plan, a, b, output, stream, agree);
    }
  });
}

void run_all_gather_scaled_matmul(Communicator& comm, const algo::AllGatherMatmulPlan& plan, Algorithm chosen,
                                  int chunks_per_rank, const TensorRef& a_shard, const std::vector<TensorRef>& bs,
                                  const TensorRef& a_scale, const std::vector<TensorRef>& b_scales,
                                  const std::vector<TensorRef>& outputs, const TensorRef& gathered_a,
                                  const std::vector<algo::ScaledEpilogue>& epilogues, cudaStream_t stream,
                                  const algo::AgreeFn& agree) {
  run_guarded(comm, "all_gather_scaled_matmul", [&] {
    if (chosen == Algorithm::kFused && *algo::fused_scaled_unsupported(plan) == '\0') {
      algo::fused_all_gather_scaled_matmul(comm, plan, a_shard, bs, a_scale, b_scales, outputs, gathered_a, epilogues,
                                           stream, agree, chunks_per_rank);
      return;
    }
    if (chosen == Algorithm::kPipelined || chosen == Algorithm::kFused) {  // fused's fallback, as unscaled
      algo::pipelined_all_gather_scaled_matmul(comm, plan, a_shard, bs, a_scale, b_scales, outputs, gathered_a,
                                               epilogues, stream, agree, chunks_per_rank);
      return;
    }
    algo::sequential_all_gather_scaled_matmul(comm, plan, a_shard, bs, a_scale, b_scales, outputs, gathered_a,
                                              epilogues, stream, agree);
  });
}

void run_scaled_matmul_reduce_scatter(Communicator& comm, const algo::MatmulReduceScatterPlan& plan, Algorithm chosen,
                                      int chunks_per_rank, const TensorRef& a, const TensorRef& b,
                                      const TensorRef& a_scale, const TensorRef& b_scale, const TensorRef& output,
                                      const algo::ScaledEpilogue& epilogue, cudaStream_t stream,
                                      const algo::AgreeFn& agree) {
  run_guarded(comm, "scaled_matmul_reduce_scatter", [&] {
    const int sms = impl_of(comm).sm_budget;
    if (chosen == Algorithm::kFused && *algo::fused_scaled_rs_unsupported(plan, a, b, output, sms) == '\0') {
      algo::fused_scaled_matmul_reduce_scatter(comm, plan, a, b, a_scale, b_scale, output, epilogue, stream, agree,
                                               chunks_per_rank);
      return;
    }
    if (chosen == Algorithm::kPipelined || chosen == Algorithm::kFused) {  // fused's fallback, as unscaled
      algo::pipelined_scaled_matmul_reduce_scatter(comm, plan, a, b, a_scale, b_scale, output, epilogue, stream, agree,
                                                   chunks_per_rank);
      return;
    }
    algo::sequential_scaled_matmul_reduce_scatter(comm, plan, a, b, a_scale, b_scale, output, epilogue, stream, agree);
  });
}

}  // namespace asynctp::ops
