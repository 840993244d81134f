// asynctp-bench: every algorithm on every shape, checked against a reference, timed beside the GEMM
// alone and the communication alone. See --help (cli.cc) and docs/benchmarks.md.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <sstream>

#include "asynctp/asynctp.h"
#include "bench/cli.h"
#include "bench/json.h"
#include "algo/fused.h"
#include "comm/communicator_impl.h"
#include "common/check.h"
#include "kernels/fused/ag_gemm.h"
#include "reference/reference.h"

namespace asynctp::bench {
namespace {

struct DeviceBuffer {
  void* p = nullptr;
  explicit DeviceBuffer(size_t bytes) { ASYNCTP_CUDA_CHECK(cudaMalloc(&p, bytes)); }
  ~DeviceBuffer() { cudaFree(p); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  float* f() const { return static_cast<float*>(p); }
};

constexpr size_t kFlushBytes = 512u << 20;  // several times the H100/H200 L2

class Timer {
 public:
  Timer(RankContext& ctx, const Args& args, cudaStream_t stream) : ctx_(ctx), args_(args), stream_(stream) {
    ASYNCTP_CUDA_CHECK(cudaEventCreate(&start_));
    ASYNCTP_CUDA_CHECK(cudaEventCreate(&stop_));
    if (args.flush_l2) ASYNCTP_CUDA_CHECK(cudaMalloc(&flush_, kFlushBytes));
  }
  ~Timer() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
    if (flush_) cudaFree(flush_);
  }

  // Times every function in turn, one call of each per round (warm-up rounds first), so that a drift
  // of clocks or temperature during the run falls on all of them alike. Returns each one's median
  // over the rounds on this rank, then the slowest rank's median (as torch_anchor.py does). Every
  // call starts with the ranks lined up by a host barrier.
  std::vector<double> medians_us(const std::vector<std::function<void()>>& fns) {
    for (int i = 0; i < args_.warmup; ++i) {
      for (const auto& fn : fns) fn();
    }
    ASYNCTP_CUDA_CHECK(cudaStreamSynchronize(stream_));
    std::vector<std::vector<float>> us(fns.size());
    for (int i = 0; i < args_.iters; ++i) {
      for (size_t f = 0; f < fns.size(); ++f) {
        if (flush_) ASYNCTP_CUDA_CHECK(cudaMemsetAsync(flush_, i & 0xFF, kFlushBytes, stream_));
        ASYNCTP_CUDA_CHECK(cudaStreamSynchronize(stream_));
        ctx_.allgather("");
        ASYNCTP_CUDA_CHECK(cudaEventRecord(start_, stream_));
        fns[f]();
        ASYNCTP_CUDA_CHECK(cudaEventRecord(stop_, stream_));
        ASYNCTP_CUDA_CHECK(cudaEventSynchronize(stop_));
        float ms = 0;
        ASYNCTP_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
        us[f].push_back(ms * 1000.0f);
      }
    }
    std::string mine;
    for (auto& u : us) {
      std::sort(u.begin(), u.end());
      mine += std::to_string(u[u.size() / 2]) + " ";
    }
    std::vector<double> worst(fns.size(), 0.0);
    for (const auto& theirs : ctx_.allgather(mine)) {
      std::istringstream in(theirs);
      for (double& w : worst) {
        double v = 0;
        in >> v;
        w = std::max(w, v);
      }
    }
    return worst;
  }

 private:
  RankContext& ctx_;
  const Args& args_;
  cudaStream_t stream_;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
  void* flush_ = nullptr;
};

struct Row {
  std::string algorithm;
  bool correct = false;
  std::string error;  // the op refused or failed
  double max_err = 0, median_us = NAN;
};

std::string shape_text(const Shape& s) {
  return std::to_string(s.M) + "x" + std::to_string(s.N) + "x" + std::to_string(s.K);
}

// One (shape, op) on this rank: inputs, reference, baselines, then each algorithm.
class Case {
 public:
  Case(RankContext& ctx, Communicator& comm, const Args& args, const Shape& shape, bool ag, cudaStream_t stream)
      : ctx_(ctx), comm_(comm), args_(args), s_(shape), ag_(ag), stream_(stream), ws_(ctx.world_size), r_(ctx.rank) {}

  // Empty if the shape can be sharded over the ranks, else why not.
  std::string unsupported() const {
    if (ag_ && !args_.gather_last && s_.M % ws_) return "M not divisible by the world size";
    if (s_.K % ws_ && (!ag_ || args_.gather_last)) return "K not divisible by the world size";
    if (!ag_ && !args_.scatter_last && s_.M % ws_) return "M not divisible by the world size";
    if (!ag_ && args_.scatter_last && s_.N % ws_) return "N not divisible by the world size";
    return {};
  }

  void run(std::vector<std::string>& lines, int& step, int steps) {
    const int64_t M = s_.M, N = s_.N, K = s_.K;
    const size_t es = dtype_size(args_.dtype);
    const bool col = args_.b_layout == BLayout::kColMajor;
    const int dim = ag_ ? (args_.gather_last ? -1 : 0) : (args_.scatter_last ? -1 : 0);
    // Every rank's inputs come from seeds, so the reference needs no communication.
    const int64_t kl = K / ws_;
    const reference::GenMatrix gen_a = ag_ ? (args_.gather_last ? reference::GenMatrix{11, 0, kl}
                                                                 : reference::GenMatrix{11, M / ws_, 0})
                                           : reference::GenMatrix{11, 0, kl};
    const reference::GenMatrix gen_b = ag_ ? reference::GenMatrix{29, 0, 0} : reference::GenMatrix{29, kl, 0};

    // This rank's tensors.
    int64_t a_rows = M, a_cols = K, a_row0 = 0, a_col0 = 0, b_rows = K, b_row0 = 0;
    if (ag_ && !args_.gather_last) a_rows = M / ws_, a_row0 = r_ * a_rows;
    if (!ag_ || args_.gather_last) a_cols = kl, a_col0 = r_ * kl;
    if (!ag_) b_rows = kl, b_row0 = r_ * kl;
    int64_t out_rows = M, out_cols = N, out_row0 = 0, out_col0 = 0;
    if (!ag_ && !args_.scatter_last) out_rows = M / ws_, out_row0 = r_ * out_rows;
    if (!ag_ && args_.scatter_last) out_cols = N / ws_, out_col0 = r_ * out_cols;

    DeviceBuffer a(a_rows * a_cols * es), b(b_rows * N * es), out(out_rows * out_cols * es);
    reference::fill(a.p, args_.dtype, a_rows, a_cols, false, gen_a, a_row0, a_col0, stream_);
    reference::fill(b.p, args_.dtype, b_rows, N, col, gen_b, b_row0, 0, stream_);
    const TensorRef ta = TensorRef::dense(a.p, args_.dtype, {a_rows, a_cols});
    const TensorRef tb = col ? TensorRef::dense(b.p, args_.dtype, {N, b_rows}) : TensorRef::dense(b.p, args_.dtype, {b_rows, N});
    const TensorRef tout = TensorRef::dense(out.p, args_.dtype, {out_rows, out_cols});

    DeviceBuffer ref(M * N * sizeof(float));
    {
      DeviceBuffer a_full(M * K * sizeof(float)), b_full(K * N * sizeof(float));
      reference::fill_fp32(a_full.f(), M, K, gen_a, 0, 0, stream_);
      reference::fill_fp32(b_full.f(), K, N, gen_b, 0, 0, stream_);
      reference::Fp32Gemm().run(a_full.f(), b_full.f(), ref.f(), M, N, K, stream_);
      ASYNCTP_CUDA_CHECK(cudaStreamSynchronize(stream_));
    }

    // Baselines: the GEMM each GPU does, alone (cuBLAS, and with fused in --algorithms our kernel with
    // every chunk in place), and the collective alone. They are timed with the algorithms, in turn.
    std::vector<std::function<void()>> timed;
    std::vector<double*> results;
    double gemm_us = 0, comm_us = 0, fused_gemm_us = NAN;
    const int64_t gm = M, gk = ag_ ? K : kl;
    DeviceBuffer ga(gm * gk * es), gc(gm * N * es), gb(gk * N * es);
    reference::fill(ga.p, args_.dtype, gm, gk, false, gen_a, 0, 0, stream_);
    reference::fill(gb.p, args_.dtype, gk, N, col, reference::GenMatrix{29, 0, 0}, 0, 0, stream_);
    gemm::Problem p;
    p.M = gm, p.N = N, p.K = gk, p.dtype = args_.dtype, p.b_layout = args_.b_layout;
    timed.push_back([&] { comm_.impl().gemm.run(p, ga.p, gb.p, gc.p, stream_); });
    results.push_back(&gemm_us);
    const bool fused = std::find(args_.algorithms.begin(), args_.algorithms.end(), Algorithm::kFused) !=
                       args_.algorithms.end();
    kernels::fused::AgGemmArgs g;
    g.dtype = args_.dtype, g.b_layout = args_.b_layout, g.M = gm, g.N = N, g.K = gk;
    g.a = ga.p, g.b = gb.p, g.c = gc.p;
    // rs: the partial GEMM with the reduce-scatter's tile width, no staging or reduction.
    if (!ag_) g.tile_n = static_cast<int>(kernels::fused::kRsTileN);
    if (fused && *kernels::fused::ag_gemm_unsupported(g) == '\0') {
      algo::attach_tail_split(comm_, g, stream_);
      timed.push_back([&] { kernels::fused::run_ag_gemm(g, stream_); });
      results.push_back(&fused_gemm_us);
    }
    const ncclDataType_t t = args_.dtype == DType::kBF16 ? ncclBfloat16 : ncclFloat16;
    if (ag_) {
      timed.push_back([&] { ASYNCTP_NCCL_CHECK(ncclAllGather(a.p, ga.p, a_rows * a_cols, t, comm_.nccl(), stream_)); });
    } else {
      timed.push_back([&] {
        ASYNCTP_NCCL_CHECK(ncclReduceScatter(gc.p, out.p, out_rows * out_cols, t, ncclSum, comm_.nccl(), stream_));
      });
    }
    results.push_back(&comm_us);

    // Each algorithm is checked first; only a correct one is timed.
    const char* op = ag_ ? "ag" : "rs";
    std::vector<Row> rows;
    rows.reserve(args_.algorithms.size());
    for (Algorithm algo : args_.algorithms) {
      rows.emplace_back();
      Row& row = rows.back();
      row.algorithm = algorithm_name(algo);
      if (r_ == 0) {
        std::fprintf(stderr, "[%d/%d] %s %s %s\n", ++step, steps, shape_text(s_).c_str(), op, row.algorithm.c_str());
      }
      OpOptions options;
      options.algorithm = algo;
      options.b_layout = args_.b_layout;
      options.chunks_per_rank = args_.chunks_per_rank;
      auto call = [&, options] {
        if (ag_) {
          all_gather_matmul(comm_, ta, {tb}, dim, {tout}, TensorRef{}, stream_, options);
        } else {
          matmul_reduce_scatter(comm_, ta, tb, dim, ReduceOp::kSum, tout, stream_, options);
        }
      };
      reference::poison(out.p, out_rows * out_cols * es, stream_);
      try {
        call();
        const auto cmp = reference::compare(out.p, args_.dtype, out_rows, out_cols, ref.f(), N, out_row0, out_col0,
                                            1.0f, reference::tolerance(args_.dtype, ag_ ? 1 : ws_), stream_);
        // Correct only where every rank's slice is.
        bool all_ok = true;
        for (const auto& v : ctx_.allgather(std::to_string(cmp.ok()) + " " + std::to_string(cmp.max_abs_err))) {
          std::istringstream in(v);
          int ok;
          double err;
          in >> ok >> err;
          all_ok = all_ok && ok;
          row.max_err = std::max(row.max_err, err);
        }
        row.correct = all_ok;
        if (all_ok) {
          timed.push_back(call);
          results.push_back(&row.median_us);
        }
      } catch (const Error& e) {
        row.error = e.what();
      }
    }
    Timer timer(ctx_, args_, stream_);
    const std::vector<double> medians = timer.medians_us(timed);
    for (size_t i = 0; i < medians.size(); ++i) *results[i] = medians[i];

    if (r_ != 0) return;
    cudaDeviceProp prop{};
    ASYNCTP_CUDA_CHECK(cudaGetDeviceProperties(&prop, ctx_.device));
    const double flops = 2.0 * M * N * K / (ag_ ? 1 : ws_);
    const char* dim_name = dim == 0 ? "0" : "last";
    std::printf("\n%s %s  (world %d, %s, %s_dim %s, B %s)   GEMM alone %.1f us, %s alone %.1f us\n",
                ag_ ? "all_gather_matmul" : "matmul_reduce_scatter", shape_text(s_).c_str(), ws_,
                dtype_name(args_.dtype), ag_ ? "gather" : "scatter", dim_name, col ? "col-major" : "row-major", gemm_us,
                ag_ ? "all-gather" : "reduce-scatter", comm_us);
    if (!std::isnan(fused_gemm_us)) {
      std::printf("  fused kernel as a GEMM alone (%s): %.1f us, %.1f%% of cuBLAS's throughput\n",
                  ag_ ? "every chunk in place" : "no staging, no reduction", fused_gemm_us, 100.0 * gemm_us / fused_gemm_us);
    }
    std::printf("  %-11s %10s %9s %10s %9s %10s  %s\n", "algorithm", "median_us", "TFLOP/s", "vs_seq", "overlap",
                "max_err", "check");
    double seq_us = NAN;
    for (const Row& row : rows) {
      if (row.algorithm == "sequential" && row.correct) seq_us = row.median_us;
    }
    for (const Row& row : rows) {
      const double tflops = flops / row.median_us / 1e6;
      const double overlap = std::max(gemm_us, comm_us) / row.median_us;
      if (!row.error.empty()) {
        std::printf("  %-11s %s\n", row.algorithm.c_str(), ("error: " + row.error).c_str());
      } else {
        std::printf("  %-11s %10.1f %9.1f %9.2fx %9.2f %10.3g  %s\n", row.algorithm.c_str(), row.median_us, tflops,
                    seq_us / row.median_us, overlap, row.max_err, row.correct ? "ok" : "WRONG (not timed)");
      }
      JsonLine j;
      j.add("op", op).add("algorithm", row.algorithm).add("M", s_.M).add("N", s_.N).add("K", s_.K);
      j.add("world_size", ws_).add("dtype", dtype_name(args_.dtype)).add("dim", dim_name);
      j.add("b_layout", col ? "col" : "row").add("median_us", row.median_us).add("tflops", tflops);
      j.add("max_abs_err", row.max_err).add("correct", row.correct).add("gemm_alone_us", gemm_us);
      j.add("comm_alone_us", comm_us).add("speedup_vs_sequential", seq_us / row.median_us);
      if (!std::isnan(fused_gemm_us)) j.add("fused_gemm_alone_us", fused_gemm_us);
      j.add("overlap_efficiency", overlap).add("flush_l2", args_.flush_l2).add("iters", args_.iters);
      j.add("gpu", prop.name);
      if (!row.error.empty()) j.add("error", row.error);
      lines.push_back(j.str());
    }
    std::fflush(stdout);
  }

 private:
  RankContext& ctx_;
  Communicator& comm_;
  const Args& args_;
  Shape s_;
  bool ag_;
  cudaStream_t stream_;
  int ws_, r_;
};

int run_rank(RankContext& ctx, const Args& args) {
  CommunicatorOptions options;
  options.device = ctx.device;
  auto comm = Communicator::create(ctx.rank, ctx.world_size, ctx.nccl_id, options);
  cudaStream_t stream;
  ASYNCTP_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::vector<std::string> lines;
  int step = 0;
  const int steps = static_cast<int>(args.shapes.size() * ((args.run_ag ? 1 : 0) + (args.run_rs ? 1 : 0)) *
                                     args.algorithms.size());
  bool all_correct = true;
  for (const Shape& shape : args.shapes) {
    for (bool ag : {true, false}) {
      if ((ag && !args.run_ag) || (!ag && !args.run_rs)) continue;
      Case c(ctx, *comm, args, shape, ag, stream);
      const std::string why = c.unsupported();
      if (!why.empty()) {
        if (ctx.rank == 0) std::printf("\n%s %s: skipped: %s\n", ag ? "ag" : "rs", shape_text(shape).c_str(), why.c_str());
        step += static_cast<int>(args.algorithms.size());
        continue;
      }
      c.run(lines, step, steps);
    }
  }
  for (const auto& l : lines) all_correct = all_correct && l.find("\"correct\":false") == std::string::npos;
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
  std::string reason;
  const int visible = probe_cuda_device_count(&reason);
  if (visible == 0) {
    std::fprintf(stderr, "asynctp-bench: no GPU on this machine (%s)\n", reason.c_str());
    return 2;
  }
  const int n = args.gpus > 0 ? args.gpus : visible;
  if (n > visible) {
    std::fprintf(stderr, "asynctp-bench: --gpus %d but only %d GPU(s) are visible\n", n, visible);
    return 2;
  }
  try {
    const LaunchResult result = launch(n, [&](RankContext& ctx) { return bench::run_rank(ctx, args); });
    if (!result.ok) {
      std::fprintf(stderr, "asynctp-bench: %s\n", result.message.c_str());
      return 1;
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "asynctp-bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
