// Internal: the 2-D problem an op reduces to, as the algorithms take it; ops/plan.h makes it from the
// op's arguments, once they are validated.
#pragma once

#include <cstdint>
#include <vector>

#include "asynctp/ops.h"

namespace asynctp::algo {

// The scaled ops' (asynctp/scaled_ops.h): the plan's dtype is A's (fp8), B's and the output's are
// these; the scales are tensor-wise, or row-wise (one per row of A, one per column of the output).
struct Scaling {
  bool scaled = false;
  DType b_dtype = DType::kFP8E4M3, out_dtype = DType::kBF16;
  bool rowwise = false, fast_accum = false;
  // all_gather_scaled_matmul, row-wise: a_scale holds this rank's rows only and is gathered with them
  // (else it holds every row's, as where A is gathered along K).
  bool gather_a_scale = false;
  // A bias over the output's columns, added to every B's product (all-gather) or to every rank's
  // partial product before the reduction (reduce-scatter).
  bool bias = false;

  bool fp8_out() const { return out_dtype == DType::kFP8E4M3 || out_dtype == DType::kFP8E5M2; }
  // What the GEMMs' products are made in (and a reduce-scatter's partial products summed in): the
  // output's dtype, bf16 for an fp8 output (rounded to fp8 once, after the sum or the GEMM).
  DType partial_dtype() const { return fp8_out() ? DType::kBF16 : out_dtype; }
};

// A scaled call's tensors beside A, B and their scales, undefined where absent: the bias ([N]) and,
// for an fp8 output, its result scale (one fp32 element). One per B for the all-gather.
struct ScaledEpilogue {
  TensorRef bias, result_scale;
};

struct AllGatherMatmulPlan {
  bool gather_last = false;
  DType dtype = DType::kBF16;
  BLayout b_layout = BLayout::kRowMajor;
  int64_t m_local = 0;  // rows per rank (gather 0), or all rows (gather last)
  int64_t M = 0;        // rows of A after the gather
  int64_t k_local = 0;  // K per rank (gather last), or K
  int64_t K = 0;
  std::vector<int64_t> N;  // per B
  bool return_a = false;
  Scaling scaling;
};

struct MatmulReduceScatterPlan {
  bool scatter_last = false;
  DType dtype = DType::kBF16;
  BLayout b_layout = BLayout::kRowMajor;
  ReduceOp reduce_op = ReduceOp::kSum;
  int64_t M = 0, N = 0, k_local = 0;
  int64_t out_rows = 0, out_cols = 0;  // this rank's slice
  Scaling scaling;
};

}  // namespace asynctp::algo
