// Internal: the sequential algorithm, NCCL collective then cuBLASLt GEMM(s). The baseline every other
// algorithm is measured against; works wherever NCCL does.
#pragma once

#include <functional>
#include <vector>

#include "asynctp/communicator.h"
#include "algo/problem.h"

namespace asynctp::algo {

// `agree` is the ranks' argument check (ops/cross_rank_check.h). Each algorithm calls it just before its
// first step that involves another rank, so that local work enqueued before it (the partial GEMM of a
// reduce-scatter) hides the check's latency; nothing before it writes the caller's outputs.
using AgreeFn = std::function<void()>;

void sequential_all_gather_matmul(Communicator& comm, const AllGatherMatmulPlan& plan, const TensorRef& a_shard,
                                  const std::vector<TensorRef>& bs, const std::vector<TensorRef>& outputs,
                                  const TensorRef& gathered_a, cudaStream_t stream, const AgreeFn& agree);

void sequential_matmul_reduce_scatter(Communicator& comm, const MatmulReduceScatterPlan& plan, const TensorRef& a,
                                      const TensorRef& b, const TensorRef& output, cudaStream_t stream,
                                      const AgreeFn& agree);

}  // namespace asynctp::algo
