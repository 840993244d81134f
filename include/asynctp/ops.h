// The ops: an all-gather fused with the GEMM after it, and a GEMM fused with the reduce-scatter after it.
//
// Both run on the caller's stream, take non-owning TensorRefs, and are collective over the communicator:
// every rank calls them in the same order with the same shapes (checked, see OpOptions). Inputs are
// bf16 or fp16; products accumulate in fp32; outputs have the inputs' dtype.
//
// Bad input is refused before any work, with an asynctp::Error that names the argument and what was
// expected, on every rank, and the caller's outputs untouched. With ASYNCTP_CHECK_NAN=1 in the
// environment when the communicator is made, each op first scans its inputs (A and every B) for NaN
// and Inf and refuses the same way, naming the rank, the tensor and the first such element; the scan
// waits for the stream, and is skipped while the stream is being captured into a CUDA graph.
// A peer that fails or never calls ends the op with an Error within the communicator's timeout (see
// Communicator::synchronize and docs/design/reliability.md).
#pragma once

#include <cuda_runtime_api.h>

#include <vector>

#include "asynctp/tensor.h"

namespace asynctp {

class Communicator;

enum class Algorithm {
  kSequential,  // NCCL collective, then cuBLASLt: the baseline; any topology
  kPipelined,   // copy-engine chunks and per-chunk GEMMs on several streams; one node (NVLink/P2P) only
  kFused,       // one persistent CUTLASS Hopper GEMM that waits on per-chunk flags (docs/fused*.md)
  kAuto,        // per call: what a tuning cache measured fastest for this exact problem on this GPU model
                // and world size, else a model's estimate (docs/design/auto.md); also picks chunks_per_rank
};

const char* algorithm_name(Algorithm algorithm);

enum class ReduceOp { kSum, kAvg };

struct OpOptions {
  Algorithm algorithm = Algorithm::kSequential;
  BLayout b_layout = BLayout::kRowMajor;
  // Before any work, ranks compare a signature of their arguments (op, dtype, shapes, dims, layout,
  // algorithm) over a communicator of their own, so that a rank with different shapes gets an error
  // instead of a hang or a wrong answer. It costs one small host-synchronous exchange per call; it is
  // skipped while the stream is being captured into a CUDA graph, and can be turned off here by callers
  // that guarantee equal arguments.
  bool check_across_ranks = true;
  // Before any work, each tensor's pointer is looked up with CUDA (cudaPointerGetAttributes, about half a
  // microsecond each), so that host memory or another GPU's memory is refused by name. A caller that
  // knows where its tensors live (the PyTorch binding checks each tensor's device) may turn it off; a
  // pointer that is not this GPU's memory then fails on the GPU instead, or is read through UVA.
  bool check_pointers = true;
  // kPipelined: how many chunks each rank's share of the data is moved and multiplied in (1 to
  // kMaxChunksPerRank). More chunks start the first GEMM sooner but make every GEMM smaller. 0 picks
  // the default: 2 for all_gather_matmul with gather_dim last (where the first chunk cannot overlap
  // anything) and for a two-rank matmul_reduce_scatter that sums in its GEMM (docs/design/pipelined.md), else
  // 1. kFused: how many chunks each rank's shard (all_gather_matmul; 0: 1, the fastest at the seed
  // shapes, docs/design/fused_all_gather_matmul.md) or each rank's rows of the partial product (matmul_reduce_scatter; 0: one
  // per 512 rows, 1 to 4) are pushed in, each with its own flag. kSequential ignores it.
  int chunks_per_rank = 0;
};

constexpr int kMaxChunksPerRank = 16;

// kFused, all_gather_matmul: gather_dim 0 runs one persistent GEMM per B that multiplies the gathered
// rows as they arrive (docs/design/fused_all_gather_matmul.md); gather_dim last runs kPipelined. One node only, like kPipelined.
// kFused, matmul_reduce_scatter: scatter_dim 0 with rows per rank a multiple of 128 runs one persistent
// GEMM that reduces the peers' tiles of this rank's rows before its epilogue, in fp32 and in a fixed
// order (docs/design/fused_matmul_reduce_scatter.md); other cases run kPipelined.
//
// kPipelined, all_gather_matmul: where a_shard lies inside a SymmetricBuffer of this communicator (at
// the same offset on every rank), peers read it there; otherwise it is first copied into the
// communicator's symmetric workspace. Either way the op does not complete on `stream` before every
// peer has finished reading it, so the caller may overwrite a_shard right after.
//
// gather_dim 0: each rank holds a_shard [m, K] (or [m, d1, ..., K]: leading dims are flattened);
//   for each B, outputs[i] = allgather(a_shard) @ B, shape [world*m, (d1, ...,) N].
// gather_dim last (a_shard.ndim - 1): each rank holds a_shard [M, K/world] (leading dims flattened);
//   A = the shards concatenated along K, outputs[i] = A @ B, shape [M, N].
// bs: one or more B of [K, N] (kRowMajor) or [N, K] (kColMajor); all share one gather.
// gathered_a: optional output (pass an undefined TensorRef to skip): the gathered A, shape
//   [world*m, ..., K] for gather_dim 0 and [..., M, K] for gather_dim last.
void all_gather_matmul(Communicator& comm, const TensorRef& a_shard, const std::vector<TensorRef>& bs,
                       int gather_dim, const std::vector<TensorRef>& outputs, const TensorRef& gathered_a,
                       cudaStream_t stream, const OpOptions& options = {});

// Each rank holds a [M, K/world] (leading dims flattened) and b, its [K/world, N] slice of B
// ([N, K/world] for kColMajor). P = a @ b is summed (or averaged) across ranks; each rank keeps its slice:
// scatter_dim 0: output [M/world, N] (rows rank*M/world ...); scatter_dim last: output [M, N/world].
void matmul_reduce_scatter(Communicator& comm, const TensorRef& a, const TensorRef& b, int scatter_dim,
                           ReduceOp reduce_op, const TensorRef& output, cudaStream_t stream,
                           const OpOptions& options = {});

}  // namespace asynctp
