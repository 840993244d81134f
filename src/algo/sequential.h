// Internal: the sequential algorithm, NCCL collective then cuBLASLt GEMM(s). The baseline every other
// algorithm is measured against; works wherever NCCL does.
#pragma once

#include <vector>

#include "asynctp/communicator.h"
#include "ops/plan.h"

namespace asynctp::algo {

void sequential_all_gather_matmul(Communicator& comm, const ops::AllGatherMatmulPlan& plan, const TensorRef& a_shard,
                                  const std::vector<TensorRef>& bs, const std::vector<TensorRef>& outputs,
                                  const TensorRef& gathered_a, cudaStream_t stream);

void sequential_matmul_reduce_scatter(Communicator& comm, const ops::MatmulReduceScatterPlan& plan, const TensorRef& a,
                                      const TensorRef& b, const TensorRef& output, cudaStream_t stream);

}  // namespace asynctp::algo
