// Internal: the last step of an op's path (plan -> choose -> agree -> dispatch): which algorithm
// really runs an agreed call, and running it. The only place that decides it, fallbacks included.
#pragma once

#include <cuda_runtime_api.h>

#include <vector>

#include "algo/problem.h"
#include "algo/sequential.h"
#include "asynctp/communicator.h"
#include "asynctp/ops.h"
#include "asynctp/symmetric.h"
#include "asynctp/tensor.h"

namespace asynctp::ops {

// The algorithm that runs a call for which `chosen` was chosen: `chosen`, but fused runs pipelined
// where its kernel cannot take the problem (gather along the last dim: every row needs every rank's
// columns, so none can start early). It depends only on the agreed plan, so every rank takes the same
// path.
Algorithm algorithm_that_runs(const algo::AllGatherMatmulPlan& plan, Algorithm chosen);
// The same for matmul_reduce_scatter on `sms` SMs a rank: fused runs pipelined where the fused kernel
// does not take the problem (algo::fused_rs_unsupported: scatter along the last dim, rows per rank not
// whole 128-row tiles, or an odd number of them in more than two rounds of tiles, shapes or pointers
// the kernel's loads cannot take, one hardware queue per device; the plan has refused pointers off
// 16-byte boundaries on every rank, and the ranks agree on the queues and the SMs, so this too is
// alike on every rank).
Algorithm algorithm_that_runs(const algo::MatmulReduceScatterPlan& plan, const TensorRef& a, const TensorRef& b,
                              const TensorRef& output, int sms, Algorithm chosen);

void run_all_gather_matmul(Communicator& comm, const algo::AllGatherMatmulPlan& plan, Algorithm chosen,
                           int chunks_per_rank, const TensorRef& a_shard, const SymmetricBuffer* a_symmetric,
                           const std::vector<TensorRef>& bs, const std::vector<TensorRef>& outputs,
                           const TensorRef& gathered_a, cudaStream_t stream, const algo::AgreeFn& agree);

void run_matmul_reduce_scatter(Communicator& comm, const algo::MatmulReduceScatterPlan& plan, Algorithm chosen,
                               int chunks_per_rank, const TensorRef& a, const TensorRef& b, const TensorRef& output,
                               cudaStream_t stream, const algo::AgreeFn& agree);

// The scaled ops (asynctp/scaled_ops.h): sequential, pipelined, or fused where the fused kernel's fp8
// form takes the call (algo::fused_scaled_unsupported, algo::fused_scaled_rs_unsupported), else
// pipelined.
void run_all_gather_scaled_matmul(Communicator& comm, const algo::AllGatherMatmulPlan& plan, Algorithm chosen,
                                  int chunks_per_rank, const TensorRef& a_shard,
                                  const std::vector<TensorRef>& bs, const TensorRef& a_scale,
                                  const std::vector<TensorRef>& b_scales, const std::vector<TensorRef>& outputs,
                                  const TensorRef& gathered_a, const std::vector<algo::ScaledEpilogue>& epilogues,
                                  cudaStream_t stream, const algo::AgreeFn& agree);

void run_scaled_matmul_reduce_scatter(Communicator& comm, const algo::MatmulReduceScatterPlan& plan, Algorithm chosen,
                                      int chunks_per_rank, const TensorRef& a,
                                      const TensorRef& b, const TensorRef& a_scale, const TensorRef& b_scale,
                                      const TensorRef& output, const algo::ScaledEpilogue& epilogue,
                                      cudaStream_t stream, const algo::AgreeFn& agree);

}  // namespace asynctp::ops
