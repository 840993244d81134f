// asynctp-bench: every algorithm on every shape, checked against a reference, timed beside the GEMM
// alone and the communication alone (bench/case.h), printed as a table and JSON lines. See --help
// (cli.cc) and docs/performance.md.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <sstream>

#include "asynctp/asynctp.h"
#include "asynctp/launcher.h"
#include "bench/case.h"
#include "bench/cli.h"
#include "bench/json.h"
#include "comm/communicator_impl.h"
#include "common/check.h"
#include "tune/resolve.h"

namespace asynctp::bench {
namespace {

// auto's choice for this case, as the library will make it.
std::string auto_label(Communicator& comm, const CaseSetup& setup, const Shape& s, bool ag) {
  const tune::Choice c = tune::choose_for(comm, problem_key(comm, setup, s, ag));
  std::string label = std::string("auto:") + algorithm_name(c.algorithm);
  if (c.chunks_per_rank > 0) label += "/" + std::to_string(c.chunks_per_rank);
  return label + (c.from_cache ? "" : "*");
}

// Prints one case's table on rank 0 and adds its JSON lines.
void report(RankContext& ctx, const Args& args, const Shape& s, bool ag, const CaseResult& res,
            std::vector<std::string>& lines) {
  const int ws = ctx.world_size;
  const bool col = args.b_layout == BLayout::kColMajor;
  const int dim = ag ? (args.gather_last ? -1 : 0) : (args.scatter_last ? -1 : 0);
  cudaDeviceProp prop{};
  ASYNCTP_CUDA_CHECK(cudaGetDeviceProperties(&prop, ctx.device));
  const double flops = 2.0 * s.M * s.N * s.K / (ag ? 1 : ws);
  const char* dim_name = dim == 0 ? "0" : "last";
  const std::string dtype_text =
      std::string(dtype_name(args.dtype)) +
      (args.dtype == DType::kFP8E4M3 ? std::string(" -> ") + dtype_name(args.out_dtype) +
                                           (args.rowwise_scales ? ", row-wise scales" : ", tensor-wise scales")
                                     : std::string()) +
      (args.fast_accum ? ", fast accumulation" : "");
  std::printf("\n%s %s  (world %d, %s, %s_dim %s, B %s)   GEMM alone %.1f us, %s alone %.1f us\n",
              ag ? "all_gather_matmul" : "matmul_reduce_scatter", shape_text(s).c_str(), ws, dtype_text.c_str(),
              ag ? "gather" : "scatter", dim_name, col ? "col-major" : "row-major", res.gemm_us,
              ag ? "all-gather" : "reduce-scatter", res.comm_us);
  if (!std::isnan(res.fused_gemm_us)) {
    std::printf("  fused kernel as a GEMM alone (%s): %.1f us, %.1f%% of cuBLAS's throughput\n",
                ag ? "every chunk in place" : "no staging, no reduction", res.fused_gemm_us,
                100.0 * res.gemm_us / res.fused_gemm_us);
  }
  std::printf("  %-16s %10s %9s %10s %9s %10s  %s\n", "algorithm", "median_us", "TFLOP/s", "vs_seq", "overlap",
              "max_err", "check");
  double seq_us = NAN;
  for (const Row& row : res.rows) {
    if (row.candidate.options.algorithm == Algorithm::kSequential && row.correct) seq_us = row.median_us;
  }
  for (const Row& row : res.rows) {
    const std::string& label = row.candidate.label;
    const double tflops = flops / row.median_us / 1e6;
    const double overlap = std::max(res.gemm_us, res.comm_us) / row.median_us;
    if (!row.error.empty()) {
      std::printf("  %-16s %s\n", label.c_str(), ("error: " + row.error).c_str());
    } else {
      std::printf("  %-16s %10.1f %9.1f %9.2fx %9.2f %10.3g  %s\n", label.c_str(), row.median_us, tflops,
                  seq_us / row.median_us, overlap, row.max_err, row.correct ? "ok" : "WRONG (not timed)");
    }
    JsonLine j;
    j.add("op", ag ? "ag" : "rs").add("algorithm", algorithm_name(row.candidate.options.algorithm));
    if (row.candidate.options.algorithm == Algorithm::kAuto) j.add("auto_choice", label.substr(5));
    j.add("M", s.M).add("N", s.N).add("K", s.K);
    j.add("world_size", ws).add("dtype", dtype_name(args.dtype));
    if (args.dtype == DType::kFP8E4M3) {
      j.add("scales", args.rowwise_scales ? "row" : "tensor").add("fast_accum", args.fast_accum);
      j.add("out_dtype", dtype_name(args.out_dtype));
    }
    j.add("dim", dim_name);
    j.add("b_layout", col ? "col" : "row").add("median_us", row.median_us).add("tflops", tflops);
    j.add("max_abs_err", row.max_err).add("correct", row.correct).add("gemm_alone_us", res.gemm_us);
    j.add("comm_alone_us", res.comm_us).add("speedup_vs_sequential", seq_us / row.median_us);
    if (!std::isnan(res.fused_gemm_us)) j.add("fused_gemm_alone_us", res.fused_gemm_us);
    j.add("overlap_efficiency", overlap).add("flush_l2", args.flush_l2).add("iters", args.iters);
    j.add("gpu", prop.name).add("transport", ctx.group ? "in-process" : "nccl");
    if (!row.error.empty()) j.add("error", row.error);
    lines.push_back(j.str());
  }
  std::fflush(stdout);
}

int run_rank(RankContext& ctx, const Args& args) {
  CommunicatorOptions options;
  options.device = ctx.device;
  auto comm = Communicator::create(ctx, options);
  cudaStream_t stream;
  ASYNCTP_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::vector<std::string> lines;
  int step = 0;
  const int steps = static_cast<int>(args.shapes.size() * ((args.run_ag ? 1 : 0) + (args.run_rs ? 1 : 0)) *
                                     args.algorithms.size());
  bool all_correct = true;
  const CaseSetup setup = setup_of(args);
  for (const Shape& shape : args.shapes) {
    for (bool ag : {true, false}) {
      if ((ag && !args.run_ag) || (!ag && !args.run_rs)) continue;
      const std::string why = unsupported(setup, shape, ag, ctx.world_size);
      if (!why.empty()) {
        if (ctx.rank == 0) std::printf("\n%s %s: skipped: %s\n", ag ? "ag" : "rs", shape_text(shape).c_str(), why.c_str());
        step += static_cast<int>(args.algorithms.size());
        continue;
      }
      std::vector<Candidate> candidates;
      for (Algorithm a : args.algorithms) {
        Candidate c;
        c.label = a != Algorithm::kAuto ? algorithm_name(a) : auto_label(*comm, setup, shape, ag);
        c.options.algorithm = a;
        c.options.chunks_per_rank = a == Algorithm::kAuto ? 0 : args.chunks_per_rank;
        candidates.push_back(c);
      }
      const CaseResult res = run_case(ctx, *comm, setup, shape, ag, stream, candidates, [&](const Candidate& c) {
        std::fprintf(stderr, "[%d/%d] %s %s %s\n", ++step, steps, shape_text(shape).c_str(), ag ? "ag" : "rs",
                     c.label.c_str());
      });
      if (ctx.rank == 0) report(ctx, args, shape, ag, res, lines);
      for (const Row& row : res.rows) all_correct = all_correct && row.correct;
    }
  }
  if (ctx.rank == 0 && !args.json.empty()) {
    std::ofstream out(args.json);
    for (const auto& l : lines) out << l << "\n";
    ASYNCTP_CHECK(out.good(), "asynctp-bench: could not write ", args.json);
  }
  ASYNCTP_CUDA_CHECK(cudaStreamDestroy(stream));
  return all_correct ? 0 : 3;
}

}  // namespace
}  // namespace asynctp::bench

int main(int argc, char** argv) {
  using namespace asynctp;
  bench::Args args;
  try {
    args = bench::parse_args(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  if (args.help) {
    std::fputs(bench::kUsage, stdout);
    return 0;
  }
  return bench::launch_tool("asynctp-bench", args.gpus, args.ranks_per_gpu,
                            [&](RankContext& ctx) { return bench::run_rank(ctx, args); });
}
