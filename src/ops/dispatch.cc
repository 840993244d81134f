#include "ops/dispatch.h"

#include "algo/fused.h"
#include "algo/pipelined.h"
#include "algo/sequential.h"

namespace asynctp::ops {

Algorithm algorithm_that_runs(const algo::AllGatherMatmulPlan& plan, Algorithm chosen) {
  if (chosen == Algorithm::kFused && plan.gather_last) return Algorithm::kPipelined;
  return chosen;
}

Algorithm algorithm_that_runs(const algo::MatmulReduceScatterPlan& plan, const TensorRef& a, const TensorRef& b,
                              const TensorRef& output, Algorithm chosen) {
  if (chosen == Algorithm::kFused && *algo::fused_rs_unsupported(plan, a, b, output) != '\0') {
    return Algorithm::kPipelined;
  }
  return chosen;
}

void run_all_gather_matmul(Communicator& comm, const algo::AllGatherMatmulPlan& plan, Algorithm chosen,
                           int chunks_per_rank, const TensorRef& a_shard, const SymmetricBuffer* a_symmetric,
                           const std::vector<TensorRef>& bs, const std::vector<TensorRef>& outputs,
                           const TensorRef& gathered_a, cudaStream_t stream, const algo::AgreeFn& agree) {
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
}

void run_matmul_reduce_scatter(Communicator& comm, const algo::MatmulReduceScatterPlan& plan, Algorithm chosen,
                               int chunks_per_rank, const TensorRef& a, const TensorRef& b, const TensorRef& output,
                               cudaStream_t stream, const algo::AgreeFn& agree) {
  switch (algorithm_that_runs(plan, a, b, output, chosen)) {
    case Algorithm::kPipelined:
      algo::pipelined_matmul_reduce_scatter(comm, plan, a, b, output, stream, agree, chunks_per_rank);
      return;
    case Algorithm::kFused:
      algo::fused_matmul_reduce_scatter(comm, plan, a, b, output, stream, agree, chunks_per_rank);
      return;
    default:
      algo::sequential_matmul_reduce_scatter(comm, plan, a, b, output, stream, agree);
  }
}

}  // namespace asynctp::ops
