// Reference results computed another way: every rank can regenerate every rank's inputs from a seed
// (no communication), materialise the whole problem in fp32 and multiply it with an fp32 GEMM. Used by
// the GPU tests and asynctp-bench; not part of the library.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "asynctp/tensor.h"

namespace asynctp::reference {

// A logical matrix whose entry (i, j) is a hash of (seed, block, i, j): integers in [-32, 32) / 32,
// exact in bf16 and fp16. Blocks model shards: with row_block = m, rows [r*m, (r+1)*m) come from
// seed + r, as if each rank had generated its own shard.
struct GenMatrix {
  uint64_t seed = 0;
  int64_t row_block = 0;  // 0: no blocks along rows
  int64_t col_block = 0;  // 0: no blocks along columns
};

// Writes the logical [rows, cols] window at (row0, col0) of `g` into `data` (dtype), stored row-major,
// or column-major ([cols][rows]) where `col_major`.
void fill(void* data, DType dtype, int64_t rows, int64_t cols, bool col_major, const GenMatrix& g, int64_t row0,
          int64_t col0, cudaStream_t stream);

// The same window as fp32, row-major.
void fill_fp32(float* data, int64_t rows, int64_t cols, const GenMatrix& g, int64_t row0, int64_t col0,
               cudaStream_t stream);

// The same window as fp32, each value rounded through `as` first (for fp8, whose values the hash
// does not all hit exactly): what an fp8 tensor filled with fill() holds.
void fill_fp32_as(float* data, DType as, int64_t rows, int64_t cols, const GenMatrix& g, int64_t row0, int64_t col0,
                  cudaStream_t stream);

// data[i][j] *= row_scale[i or 0] * col_scale[j or 0] for fp32 row-major data [rows, cols]; the scales
// are device fp32 vectors of row_count (1 or rows) and col_count (1 or cols) values, or null for none.
void scale(float* data, int64_t rows, int64_t cols, const float* row_scale, int64_t row_count, const float* col_scale,
           int64_t col_count, cudaStream_t stream);

// data[i][j] += times * row[j] for fp32 row-major data [rows, cols] and a device fp32 vector of cols values.
void add_row(float* data, int64_t rows, int64_t cols, const float* row, float times, cudaStream_t stream);

// Sets every byte to 0xFF: NaN in bf16 and fp16, so an element an op forgot to write fails the check.
void poison(void* data, size_t bytes, cudaStream_t stream);

struct Comparison {
  double max_abs_err = 0;
  double max_abs_ref = 0;
  int64_t bad = 0;  // NaN/Inf in `out`, or beyond the tolerance
  int64_t first_bad_row = -1, first_bad_col = -1, last_bad_row = -1;  // of `out`, where bad > 0
  bool ok() const { return bad == 0; }
  // Where the bad elements lie, for a failure message; empty when there are none.
  std::string where() const;
};

// Compares out [rows, cols] (dtype, dense) with scale * ref[row0 + i][col0 + j] (ref fp32 with leading
// dimension ld_ref). An element is bad where |out - ref| > tol * max(1, max|ref|) or out is not finite.
Comparison compare(const void* out, DType dtype, int64_t rows, int64_t cols, const float* ref, int64_t ld_ref,
                   int64_t row0, int64_t col0, float scale, double tol, cudaStream_t stream);

// The tolerance compare() uses for outputs of `dtype` after a reduction over `terms` partial sums
// rounded to dtype (1 for a plain GEMM); for fp8 e4m3, summed in bf16 and rounded to fp8 once.
double tolerance(DType dtype, int terms);

// tolerance() for an fp8 GEMM with fast accumulation over `k` products a term: Hopper's fp8 tensor
// cores then keep the running sum at reduced precision (no promotion to fp32 along K), whose error
// grows about as sqrt(k); 2^-7 relative at k = 1024 covers what cuBLASLt's own fp8 GEMM shows.
double fast_accum_tolerance(DType dtype, int terms, int64_t k);

// C[M, N] = A[M, K] @ B[K, N], all fp32 row-major, fp32 arithmetic (no TF32), through cuBLASLt.
class Fp32Gemm {
 public:
  Fp32Gemm();
  ~Fp32Gemm();
  Fp32Gemm(const Fp32Gemm&) = delete;
  Fp32Gemm& operator=(const Fp32Gemm&) = delete;
  void run(const float* a, const float* b, float* c, int64_t M, int64_t N, int64_t K, cudaStream_t stream);

 private:
  struct State;
  State* state_;
};

}  // namespace asynctp::reference
