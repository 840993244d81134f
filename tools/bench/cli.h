// asynctp-bench's command line: what to run, parsed and checked before any rank starts.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "asynctp/ops.h"

namespace asynctp::bench {

struct Shape {
  int64_t M, N, K;  // the global problem
};

struct Args {
  int gpus = 0;  // 0: every visible GPU
  int ranks_per_gpu = 1;  // > 1: the ranks are threads of one process (the in-process transport)
  std::vector<Shape> shapes;
  bool run_ag = true, run_rs = true;
  DType dtype = DType::kBF16;  // kFP8E4M3: the scaled ops, of output out_dtype
  DType out_dtype = DType::kBF16;  // fp8: the scaled ops' output, bf16 or fp16
  bool rowwise_scales = false;  // fp8: a scale per row of A and column of B, not one per tensor
  bool fast_accum = false;      // fp8: use_fast_accum (and the fused kernel, which accumulates so, timed)
  bool bias = false;            // fp8: the scaled ops' bias over N, in the ops and the GEMMs alone
  bool gather_last = false;
  bool scatter_last = false;
  BLayout b_layout = BLayout::kRowMajor;
  std::vector<Algorithm> algorithms{Algorithm::kSequential};
  int chunks_per_rank = 0;  // OpOptions::chunks_per_rank for pipelined
  int iters = 30;
  int warmup = 8;
  bool flush_l2 = false;
  std::string json;
  bool help = false;
};

// The built-in shape sets: `seeds`, and `sweep` (8 more, M from 256 to 32768: docs/design/auto.md).
std::vector<Shape> seed_shapes();
std::vector<Shape> sweep_shapes();

// Throws asynctp::Error naming the option and what was expected.
Args parse_args(const std::vector<std::string>& argv);

extern const char* const kUsage;

}  // namespace asynctp::bench
