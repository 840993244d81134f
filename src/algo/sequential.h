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

// The scaled ops (asynctp/scaled_ops.h; plan.scaling is set): the same collectives around cuBLASLt's
// fp8 GEMM, which adds the bias and rounds to an fp8 output with its result scale. Row-wise, a_scale
// is gathered with A's rows where it holds this rank's only (plan.scaling.gather_a_scale). The
// reduce-scatter's partials for an fp8 output are bf16, reduced, then rounded with the result scale.
void sequential_all_gather_scaled_matmul(Communicator& comm, const AllGatherMatmulPlan& plan, const TensorRef& a_shard,
                                         const std::vector<TensorRef>& bs, const TensorRef& a_scale,
                                         const std::vector<TensorRef>& b_scales, const std::vector<TensorRef>& outputs,
                                         const TensorRef& gathered_a, const std::vector<ScaledEpilogue>& epilogues,
                                         cudaStream_t stream, const AgreeFn& agree);

void sequential_scaled_matmul_reduce_scatter(Communicator& comm, const MatmulReduceScatterPlan& plan,
                                             const TensorRef& a, const TensorRef& b, const TensorRef& a_scale,
                                             const TensorRef& b_scale, const TensorRef& output,
                                             const ScaledEpilogue& epilogue, cudaStream_t stream, const AgreeFn& agree);

// Steps the sequential algorithms share.
// Before a collective of the transport's whose kernels wait without bound (NCCL's), where `stream` is
// being captured: the communicator's bounded barrier, so that a replay whose peer is gone ends with the
// barrier's report instead of in a collective that never returns. A call made directly needs none: the
// watchdog follows it (comm/watchdog.h), while a replay is the caller's. (A peer that dies between its
// barrier and its collective, or one outside this node's LSA team, is not covered.)
void bound_captured_collective(Communicator& comm, cudaStream_t stream);
// A gathered into gathered_a, or into scratch where no gathered_a is asked for: [M, K], dense. Where
// `extra_bytes` > 0, *extra gets that much more of the same scratch, for the caller's own use.
char* gather_a(Communicator& comm, const AllGatherMatmulPlan& plan, const TensorRef& a_shard,
               const TensorRef& gathered_a, size_t extra_bytes, char** extra, cudaStream_t stream);

}  // namespace asynctp::algo
