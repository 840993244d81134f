// Internal: the pipelined algorithm. Copy-engine chunks moved between the ranks' symmetric buffers and
// one cuBLASLt GEMM per chunk, spread over side streams joined back into the caller's, ordered across
// ranks by epoch flags (algo/overlap_resources.h). No host synchronisation after the argument check,
// so a call can be captured in a CUDA graph (after one call outside capture). One node only: every
// rank must reach every other's memory (the LSA team is the world). docs/design/pipelined.md explains it.
#pragma once

#include <vector>

#include "algo/sequential.h"

namespace asynctp::algo {

// `a_symmetric`: the SymmetricBuffer of this communicator that holds a_shard (peers read it in
// place), or null (it is copied into the workspace first).
void pipelined_all_gather_matmul(Communicator& comm, const AllGatherMatmulPlan& plan, const TensorRef& a_shard,
                                 const SymmetricBuffer* a_symmetric, const std::vector<TensorRef>& bs,
                                 const std::vector<TensorRef>& outputs, const TensorRef& gathered_a,
                                 cudaStream_t stream, const AgreeFn& agree, int chunks_per_rank);

// The scaled op's (plan.scaling set): the same pipeline with cuBLASLt's fp8 GEMMs (bias and result
// scale applied by each); row-wise scales of this rank's rows are gathered first, in one collective.
void pipelined_all_gather_scaled_matmul(Communicator& comm, const AllGatherMatmulPlan& plan, const TensorRef& a_shard,
                                        const std::vector<TensorRef>& bs, const TensorRef& a_scale,
                                        const std::vector<TensorRef>& b_scales, const std::vector<TensorRef>& outputs,
                                        const TensorRef& gathered_a, const std::vector<ScaledEpilogue>& epilogues,
                                        cudaStream_t stream, const AgreeFn& agree, int chunks_per_rank);

// How the reduce-scatter sums the partials that land on a rank: in the epilogue of its own GEMM (two
// ranks only), or by a sum kernel after it. kDefault: in the GEMM on two ranks where the partial has
// at least 4096 rows, else the kernel. ASYNCTP_PIPELINED_RS_SUM=gemm|kernel overrides the default (for
// measurement and tests) until `auto` chooses per shape.
enum class RsSum { kDefault, kInGemm, kKernel };
RsSum resolve_rs_sum(int world_size, int64_t rows, RsSum requested);
RsSum rs_sum_from_env();

void pipelined_matmul_reduce_scatter(Communicator& comm, const MatmulReduceScatterPlan& plan, const TensorRef& a,
                                     const TensorRef& b, const TensorRef& output, cudaStream_t stream,
                                     const AgreeFn& agree, int chunks_per_rank, RsSum sum = rs_sum_from_env());
// The scaled op's (plan.scaling set): partials (each with the bias) in Scaling::partial_dtype, summed
// by the kernel, which rounds an fp8 output with its result scale.
void pipelined_scaled_matmul_reduce_scatter(Communicator& comm, const MatmulReduceScatterPlan& plan,
                                            const TensorRef& a, const TensorRef& b, const TensorRef& a_scale,
                                            const TensorRef& b_scale, const TensorRef& output,
                                            const ScaledEpilogue& epilogue, cudaStream_t stream, const AgreeFn& agree,
                                            int chunks_per_rank);

// Throws unless every rank's memory is reachable from every other (the LSA team is the whole world,
// numbered as the world).
void require_one_node(Communicator& comm, const char* op);
// Whether every rank reaches every other's memory (the LSA team is the world, numbered alike): where
// pipelined and fused can run.
bool one_node(const Communicator& comm);

// The number of chunks per rank a call uses: `requested`, or the default where it is 0, at most `rows`.
int resolve_chunks(int requested, bool gather_last, int64_t rows);

// Rows [begin, end) of chunk `i` when `rows` rows are cut into `chunks` nearly equal chunks.
struct RowRange {
  int64_t begin, end;
  int64_t size() const { return end - begin; }
};
RowRange chunk_rows(int64_t rows, int chunks, int i);

}  // namespace asynctp::algo
