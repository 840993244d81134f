// Internal: the fused algorithm. all_gather_matmul (gather_dim 0): every rank pushes its shard into
// each peer's symmetric inbox with the copy engine, chunk by chunk, and flags each chunk; one
// persistent CUTLASS kernel per B multiplies the rows as their flags come up, this rank's own rows
// first, read in place. docs/design/fused_all_gather_matmul.md explains it. Not for gather_dim last
// (ops::algorithm_that_runs runs `pipelined` there).
#pragma once

#include <vector>

#include "algo/sequential.h"
#include "kernels/fused/fused_gemm.h"
#include "kernels/fused/tile_trace.h"

namespace asynctp::algo {

void fused_all_gather_matmul(Communicator& comm, const AllGatherMatmulPlan& plan, const TensorRef& a_shard,
                             const std::vector<TensorRef>& bs,
                             const std::vector<TensorRef>& outputs, const TensorRef& gathered_a, cudaStream_t stream,
                             const AgreeFn& agree, int chunks_per_rank);

// Why the fused kernel's fp8 form does not take a scaled call's scales, accumulation or types ("" where
// it does): it takes e4m3 A and B, use_fast_accum, tensor-wise or row-wise scales, a bias or none, and
// a bf16 or fp16 output, or an fp8 one (the plan: tensor-wise only), which the kernel's bf16 product is
// rounded to after it, with the result scale.
inline const char* fused_scaling_unsupported(const Scaling& s, DType a_dtype) {
  if (!s.fast_accum) return "without use_fast_accum";
  if (s.b_dtype != DType::kFP8E4M3 || a_dtype != DType::kFP8E4M3) return "an e5m2 input";
  return "";
}

// The scaled op's, for what fused_scaled_unsupported returns "" for (what fused_scaling_unsupported
// takes, row-wise scales too, gathered along M); the rest runs pipelined (ops dispatch). Tensor-wise,
// each B's alpha, a_scale * b_scales[i], is made on the stream first; row-wise, the epilogue applies
// a_scale by row and each B's b_scale by column, a_scale of this rank's rows travelling with them to
// the peers (ahead of their first chunk's flag). Each B's bias (epilogues[i], where defined) is
// added by the epilogue after the scales.
const char* fused_scaled_unsupported(const AllGatherMatmulPlan& plan);
void fused_all_gather_scaled_matmul(Communicator& comm, const AllGatherMatmulPlan& plan, const TensorRef& a_shard,
                                    const std::vector<TensorRef>& bs, const TensorRef& a_scale,
                                    const std::vector<TensorRef>& b_scales, const std::vector<TensorRef>& outputs,
                                    const TensorRef& gathered_a, const std::vector<ScaledEpilogue>& epilogues,
                                    cudaStream_t stream, const AgreeFn& agree, int chunks_per_rank);

// matmul_reduce_scatter (scatter_dim 0, rows per rank a multiple of 128): one persistent GEMM whose
// tiles of other ranks' rows are staged and pushed by the copy engine chunk by chunk, and whose own
// tiles add the peers' chunks before the epilogue. Only where fused_rs_unsupported is "" (ops::
// algorithm_that_runs runs `pipelined` elsewhere).
// docs/design/fused_matmul_reduce_scatter.md explains it.
void fused_matmul_reduce_scatter(Communicator& comm, const MatmulReduceScatterPlan& plan, const TensorRef& a,
                                 const TensorRef& b, const TensorRef& output, cudaStream_t stream,
                                 const AgreeFn& agree, int chunks_per_rank);

// The scaled op's, for what fused_scaled_rs_unsupported returns "" for (what fused_scaling_unsupported
// and fused_rs_unsupported take); the rest runs pipelined (ops dispatch). Each rank's partial product
// is scaled by its own scales before the ranks' are summed: tensor-wise by a_scale * b_scale, made on
// the stream first; row-wise each value by its row's a_scale and its column's b_scale, in the kernel;
// then the bias (epilogue.bias, where defined) is added to it, so the sum counts it once a rank.
const char* fused_scaled_rs_unsupported(const MatmulReduceScatterPlan& plan, const TensorRef& a, const TensorRef& b,
                                        const TensorRef& output, int sms);
void fused_scaled_matmul_reduce_scatter(Communicator& comm, const MatmulReduceScatterPlan& plan, const TensorRef& a,
                                        const TensorRef& b, const TensorRef& a_scale, const TensorRef& b_scale,
                                        const TensorRef& output, const ScaledEpilogue& epilogue, cudaStream_t stream,
                                        const AgreeFn& agree, int chunks_per_rank);

// Whether the fused reduce-scatter takes rows per rank this many: whole 128-row tiles, so that no tile
// holds two ranks' rows (and no cluster: an odd number of tile rows a rank runs one-CTA clusters,
// kernels::fused::reduce_scatter_tile_n).
inline bool fused_rs_takes_rows(int64_t rows_per_rank) { return rows_per_rank % kernels::fused::kTileRows == 0; }

// Why the fused kernel does not take this reduce-scatter on `sms` SMs a rank (the communicator's
// sm_budget, alike on every rank) ("" where it does): rows per rank an odd number of 128-row tiles run
// 128 x 128 tiles in one-CTA clusters, taken up to two rounds of them.
const char* fused_rs_unsupported(const MatmulReduceScatterPlan& plan, const TensorRef& a, const TensorRef& b,
                                 const TensorRef& output, int sms);

// The width of the fused reduce-scatter's tiles for its M x N x k_local partial product on `world_size`
// ranks with `sms` SMs each (kernels::fused::reduce_scatter_tile_n, once the way of reducing is
// chosen): 128 in one-CTA clusters where the rows per rank are an odd number of tile rows; 256 where
// the two ranks reduce in the epilogue; else 192 or 256 (fp8 with row-wise scales, `rowwise`: 128 in the
// ping-pong schedule at k_local up to 8192, rowwise_rs_pingpong_takes). One rank, which reduces
// nothing, gets what three or more would.
int fused_rs_tile_n(int world_size, DType dtype, int64_t M, int64_t N, int64_t k_local, int sms, bool rowwise = false);

// Chunks each rank's rows are pushed in by the fused reduce-scatter: `requested`, else rows / 512
// between 1 and 4; never more than the rows hold whole 256-row clusters (at least one).
int resolve_fused_rs_chunks(int requested, int64_t rows_per_rank);

// Gives `g` what shapes the kernel's grid: the SMs this rank's kernel may use (the communicator's
// budget), and the communicator's workspace for splitting its last round of tiles along K (allocated on
// first use; none while that first use is captured, and the kernel computes every tile whole).
void attach_grid(Communicator& comm, kernels::fused::FusedGemmArgs& g, cudaStream_t stream);

// Where ASYNCTP_TRACE_TILES is set (kernels/fused/tile_trace.h): gives `g` a tile trace buffer, and
// after the call's last enqueue, waits for `stream` and writes the trace.
void attach_tile_trace(kernels::fused::FusedGemmArgs& g, cudaStream_t stream);
void finish_tile_trace(Communicator& comm, const char* op, const kernels::fused::FusedGemmArgs& g,
                       kernels::fused::CallTimeline& timeline, cudaStream_t stream);

// Chunks each rank's shard is pushed in: `requested`, or kFusedDefaultChunks where it is 0; at most
// `rows_per_rank`.
constexpr int kFusedDefaultChunks = 1;
int resolve_fused_chunks(int requested, int64_t rows_per_rank);

}  // namespace asynctp::algo
