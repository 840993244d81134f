// Internal: what the scaled (fp8) ops add to an algorithm's GEMMs, for the algorithms that share code
// with the unscaled ops (sequential_scaled.cc, the pipelined ones).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "algo/problem.h"
#include "gemm/cublaslt_gemm.h"

namespace asynctp::algo {

// Part of a pipelined call's work and so of its replay key (StreamReplay::key_of): 64-bit fields only.
// All zero for the unscaled ops.
struct ScaledWork {
  int64_t on = 0, b_dtype = 0, out_dtype = 0, rowwise = 0, fast_accum = 0;
  const float* a_scale = nullptr;  // tensor-wise: one value; row-wise: one a row of the A the GEMMs read
  // Row-wise: cuBLASLt refuses a scale vector that is not 16-byte aligned (CUBLAS_STATUS_NOT_SUPPORTED),
  // and a chunk's scales may start anywhere. Such a GEMM's scales are copied first into its lane's
  // slots (2 a lane, A's then B's, slot_floats each, on the GEMM's stream: the lane's next GEMM
  // comes after this one).
  float* slots = nullptr;
  int64_t slot_floats = 0;

  // out_dtype: the GEMMs' output, the op's (a reduce-scatter's partials: Scaling::partial_dtype).
  static ScaledWork of(const Scaling& s, const float* a_scale, DType out_dtype);
  // The bytes of the slots for GEMMs of up to `max_scales` scales on `lanes` lanes (0 tensor-wise).
  static size_t slot_bytes(const Scaling& s, int64_t max_scales, int lanes);
  // Takes the slots (slot_bytes of them) at `at`.
  void use_slots(void* at, int64_t max_scales);
};

// The problem `p` (shape, A's dtype) made scaled as `w` says.
gemm::Problem scaled(gemm::Problem p, const ScaledWork& w);


// cuBLASLt's fp8 GEMM of `p` made scaled: d = (a · a_scale) @ (b · b_scale) (+ bias, times an fp8 d's
// result scale); row-wise scales that are not 16-byte aligned go through the lane's slots.
void run_scaled_gemm(gemm::GemmRunner& runner, const ScaledWork& w, const gemm::Problem& p, const void* a,
                     const void* b, gemm::ScaledPointers ptrs, void* d, cudaStream_t stream, int lane);

}  // namespace asynctp::algo
