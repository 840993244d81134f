// One (shape, op) on one rank, for asynctp-bench and asynctp-tune: inputs generated from seeds on
// every rank, a reference computed another way (fp32 cuBLASLt GEMM of the whole problem), each
// candidate checked against it, then the correct ones timed in rounds beside the GEMM alone and the
// collective alone. Collective: every rank runs the same case with the same candidates.
#pragma once

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "asynctp/asynctp.h"
#include "asynctp/launcher.h"
#include "bench/cli.h"
#include "tune/choice.h"

namespace asynctp::bench {

struct Candidate {
  std::string label;  // as printed: "pipelined", "fused/2", "auto (fused)"
  OpOptions options;
};

struct CaseSetup {
  DType dtype = DType::kBF16;  // kFP8E4M3: the scaled ops, of output out_dtype
  DType out_dtype = DType::kBF16;  // fp8: bf16 or fp16
  bool rowwise_scales = false, fast_accum = false;
  bool bias = false;  // fp8: a bias over N (Fp8Bias in case.cc)
  bool gather_last = false, scatter_last = false;
  BLayout b_layout = BLayout::kRowMajor;
  bool flush_l2 = false;
  int iters = 30, warmup = 8;
  bool time_fused_gemm = false;  // also time the fused kernel as a plain GEMM
};
CaseSetup setup_of(const Args& args);

struct Row {
  Candidate candidate;
  bool correct = false;
  std::string error;  // the op refused or failed
  double max_err = 0, median_us = NAN;  // median: the slowest rank's
};

struct CaseResult {
  double gemm_us = 0, comm_us = 0, fused_gemm_us = NAN;
  std::vector<Row> rows;
};

// Empty if the shape can be sharded over `world` ranks for this op, else why not.
std::string unsupported(const CaseSetup& setup, const Shape& shape, bool ag, int world);

// Runs the case; `progress` is called on rank 0 before each candidate is checked.
CaseResult run_case(RankContext& ctx, Communicator& comm, const CaseSetup& setup, const Shape& shape, bool ag,
                    cudaStream_t stream, const std::vector<Candidate>& candidates,
                    const std::function<void(const Candidate&)>& progress);

std::string shape_text(const Shape& s);

// The key auto and the tuning cache know this case by on `comm`.
tune::ProblemKey problem_key(const Communicator& comm, const CaseSetup& setup, const Shape& shape, bool ag);

// A tool's main after its command line: one rank per GPU (`gpus`, 0: every visible one), each running
// `rank_fn`; messages name `tool`. Returns the exit code: 2 without a GPU or with too few, 1 when a
// rank failed, else 0.
int launch_tool(const char* tool, int gpus, int ranks_per_gpu, const std::function<int(RankContext&)>& rank_fn);

}  // namespace asynctp::bench
