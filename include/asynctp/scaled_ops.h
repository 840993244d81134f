// The scaled ops: the fp8 forms of the ops (ops.h), with the meaning of PyTorch's
// torch.ops.symm_mem.fused_all_gather_scaled_matmul and fused_scaled_matmul_reduce_scatter:
//   out = (A · a_scale) @ (B · b_scale) + bias, accumulated in fp32 and rounded once to out's dtype;
//   an fp8 output is (that) · result_scale, rounded to fp8 (saturating), as torch._scaled_mm's.
//
// A and B are fp8: e4m3, or e5m2 for one of them (cuBLASLt has no e5m2 x e5m2 GEMM). B is column-major
// (options.b_layout = kColMajor: [N, K], K contiguous, the way torch.nn.Linear stores its weight and
// torch._scaled_mm needs it). K and N are multiples of 16. Outputs are bf16, fp16, or fp8 e4m3 with
// tensor-wise scales.
//
// Optional, undefined (TensorRef{}) where absent, one per B for the all-gather (an empty vector: none):
//   bias: [N], bf16 (fp16 for fp16 outputs), dense and 16-byte aligned, added to each row. The
//     reduce-scatter adds it to every rank's partial product before the reduction, as
//     reduce_scatter(torch._scaled_mm(a, b, bias=bias)) does: a sum counts it once a rank.
//   result_scale: one fp32 element, for fp8 outputs only (absent: 1). The reduce-scatter applies it
//     once, to the reduced sum (its partials are bf16).
//
// Scales are fp32 tensors on the GPU, either
//   tensor-wise: one element each (a_scale, and each b_scale). Every rank's a_scale must hold the same
//     value: the gathered A is scaled by this rank's;
//   row-wise: a_scale one per row of A ([rows, 1] or [rows]), each b_scale one per column of its
//     output ([1, N] or [N]). For all_gather_scaled_matmul along dim 0, a_scale holds either this
//     rank's rows (gathered with them) or every row of the gathered A (as PyTorch's async-TP pass
//     passes it, already gathered); along the last dim every rank holds every row.
// Both are tensor-wise or both row-wise.
//
// Algorithms: sequential (the collective, then cuBLASLt's fp8 GEMM); pipelined (copy-engine chunks, a
// cuBLASLt fp8 GEMM per chunk; row-wise scales of this rank's rows gathered first, in one collective;
// the reduce-scatter's partials summed by a kernel); fused, the fused kernel's fp8 form for both ops
// with e4m3 inputs and use_fast_accum (an fp8 output rounded from a bf16 product after it), where the
// unscaled op would run fused (along M; the reduce-scatter's rows per rank in whole 128-row tiles),
// with tensor-wise or row-wise scales
// (the reduce-scatter's partial product scaled by the rank's own before the sum), and biases (added
// after the scales: by the all-gather's epilogue, to each rank's partial product before the sum),
// else pipelined; and auto, chosen as for the unscaled ops (a
// tuning cache's "fp8 e4m3" entries, else the model, which overlaps with pipelined). Everything else
// is as for the unscaled ops: collective, checked across ranks, bad input refused on every rank with
// the outputs untouched.
#pragma once

#include <cuda_runtime_api.h>

#include <vector>

#include "asynctp/ops.h"

namespace asynctp {

struct ScaledOpOptions : OpOptions {
  ScaledOpOptions() { b_layout = BLayout::kColMajor; }
  // cuBLASLt's fast fp8 accumulation (CUBLASLT_MATMUL_DESC_FAST_ACCUM), as torch._scaled_mm's
  // use_fast_accum: faster, with fewer bits kept in the running sum.
  bool use_fast_accum = false;
};

// As all_gather_matmul (ops.h), with a_scale and one b_scale per B.
void all_gather_scaled_matmul(Communicator& comm, const TensorRef& a_shard, const std::vector<TensorRef>& bs,
                              const TensorRef& a_scale, const std::vector<TensorRef>& b_scales, int gather_dim,
                              const std::vector<TensorRef>& outputs, const TensorRef& gathered_a, cudaStream_t stream,
                              const ScaledOpOptions& options = {}, const std::vector<TensorRef>& biases = {},
                              const std::vector<TensorRef>& result_scales = {});

// As matmul_reduce_scatter (ops.h), with a_scale (row-wise: one per row of a) and b_scale (row-wise:
// one per column of the product, [1, N]).
void scaled_matmul_reduce_scatter(Communicator& comm, const TensorRef& a, const TensorRef& b, const TensorRef& a_scale,
                                  const TensorRef& b_scale, int scatter_dim, ReduceOp reduce_op,
                                  const TensorRef& output, cudaStream_t stream, const ScaledOpOptions& options = {},
                                  const TensorRef& bias = {}, const TensorRef& result_scale = {});

}  // namespace asynctp
