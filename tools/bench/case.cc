#include "bench/case.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <numeric>
#include <random>
#include <sstream>
#include <vector>

#include "algo/fused.h"
#include "algo/resources.h"
#include "bench/device_buffer.h"
#include "bench/fp8_inputs.h"
#include "comm/communicator_impl.h"
#include "common/check.h"
#include "common/element.h"
#include "kernels/fused/fused_gemm.h"
#include "kernels/fused/staged_layout.h"
#include "reference/reference.h"

namespace asynctp::bench {
namespace {

constexpr size_t kFlushBytes = 512u << 20;  // several times the H100/H200 L2

class Timer {
 public:
  Timer(RankContext& ctx, const CaseSetup& args, cudaStream_t stream) : ctx_(ctx), args_(args), stream_(stream) {
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
  // of clocks or temperature during the run falls on all of them alike; each round runs them in a
  // new order (shuffled from a fixed seed, so alike on every rank: the functions are collective), so
  // that what a call leaves behind (clocks, caches, the copy engines' queues) falls on every function
  // after every other, not always on the same neighbour. Returns each one's median
  // over the rounds on this rank, then the slowest rank's median (as torch_anchor.py does). Every
  // call starts on an idle GPU with the ranks lined up by a spin barrier on shared host memory
  // (RankContext::barrier), which lets them go within about a microsecond of each other: a collective
  // op waits for its slowest rank, so the ranks' spread at the start would count in its time.
  std::vector<double> medians_us(const std::vector<std::function<void()>>& fns) {
    for (int i = 0; i < args_.warmup; ++i) {
      for (const auto& fn : fns) fn();
    }
    ASYNCTP_CUDA_CHECK(cudaStreamSynchronize(stream_));
    std::vector<std::vector<float>> us(fns.size());
    std::vector<size_t> order(fns.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::mt19937 shuffle_rng(20261123);  // every rank runs this binary: the same orders
    for (int i = 0; i < args_.iters; ++i) {
      std::shuffle(order.begin(), order.end(), shuffle_rng);
      for (const size_t f : order) {
        if (flush_) ASYNCTP_CUDA_CHECK(cudaMemsetAsync(flush_, i & 0xFF, kFlushBytes, stream_));
        ASYNCTP_CUDA_CHECK(cudaStreamSynchronize(stream_));
        ctx_.barrier();
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
  const CaseSetup& args_;
  cudaStream_t stream_;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
  void* flush_ = nullptr;
};

}  // namespace

CaseSetup setup_of(const Args& args) {
  CaseSetup s;
  s.dtype = args.dtype;
  s.out_dtype = args.out_dtype;
  s.rowwise_scales = args.rowwise_scales;
  s.fast_accum = args.fast_accum;
  s.bias = args.bias;
  s.gather_last = args.gather_last;
  s.scatter_last = args.scatter_last;
  s.b_layout = args.b_layout;
  s.flush_l2 = args.flush_l2;
  s.iters = args.iters;
  s.warmup = args.warmup;
  s.time_fused_gemm = std::find(args.algorithms.begin(), args.algorithms.end(), Algorithm::kFused) != args.algorithms.end();
  return s;
}

std::string shape_text(const Shape& s) {
  return std::to_string(s.M) + "x" + std::to_string(s.N) + "x" + std::to_string(s.K);
}

tune::ProblemKey problem_key(const Communicator& comm, const CaseSetup& setup, const Shape& shape, bool ag) {
  tune::ProblemKey key;
  key.op = ag ? tune::Op::kAllGatherMatmul : tune::Op::kMatmulReduceScatter;
  key.M = shape.M, key.N = shape.N, key.K = shape.K;
  key.dtype = setup.dtype;
  key.last_dim = ag ? setup.gather_last : setup.scatter_last;
  // fp8: e4m3 A and B into bf16; the fused kernel's fp8 form takes fast accumulation, with tensor-wise
  // or row-wise scales (algo::fused_scaling_unsupported).
  if (setup.dtype == DType::kFP8E4M3) key.fused_kernel = setup.fast_accum;
  key.world_size = comm.world_size();
  key.gpu = impl_of(comm).gpu_name;
  return key;
}

int launch_tool(const char* tool, int gpus, int ranks_per_gpu, const std::function<int(RankContext&)>& rank_fn) {
  std::string reason;
  const int visible = probe_cuda_device_count(&reason);
  if (visible == 0) {
    std::fprintf(stderr, "%s: no GPU on this machine (%s)\n", tool, reason.c_str());
    return 2;
  }
  const int n = gpus > 0 ? gpus : visible;
  if (n > visible) {
    std::fprintf(stderr, "%s: --gpus %d but only %d GPU(s) are visible\n", tool, n, visible);
    return 2;
  }
  LaunchOptions options;
  options.in_process = ranks_per_gpu > 1;
  if (options.in_process) {
    std::printf("%s: %d ranks on %d GPU(s), %d on each, as threads of one process (the in-process transport): "
                "results are checked as ever, but timings are not NVLink timings\n",
                tool, n * ranks_per_gpu, n, ranks_per_gpu);
    std::fflush(stdout);
  }
  try {
    // In-process, rank r runs on the (r mod n)-th GPU of those from 0 on; CUDA_VISIBLE_DEVICES picks them.
    const LaunchResult result = launch(n * ranks_per_gpu, rank_fn, options);
    if (!result.ok) {
      std::fprintf(stderr, "%s: %s\n", tool, result.message.c_str());
      return 1;
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "%s: %s\n", tool, e.what());
    return 1;
  }
  return 0;
}

std::string unsupported(const CaseSetup& setup, const Shape& s, bool ag, int ws) {
  if (ag && !setup.gather_last && s.M % ws) return "M not divisible by the world size";
  if (s.K % ws && (!ag || setup.gather_last)) return "K not divisible by the world size";
  if (!ag && !setup.scatter_last && s.M % ws) return "M not divisible by the world size";
  if (!ag && setup.scatter_last && s.N % ws) return "N not divisible by the world size";
  return {};
}

CaseResult run_case(RankContext& ctx, Communicator& comm, const CaseSetup& args, const Shape& shape, bool ag,
                    cudaStream_t stream, const std::vector<Candidate>& candidates,
                    const std::function<void(const Candidate&)>& progress) {
  const int ws = ctx.world_size, r = ctx.rank;
  const int64_t M = shape.M, N = shape.N, K = shape.K;
  const size_t es = dtype_size(args.dtype);
  // fp8: the scaled ops, whose output is args.out_dtype.
  const bool scaled = args.dtype == DType::kFP8E4M3;
  const DType out_dtype = scaled ? args.out_dtype : args.dtype;
  const size_t out_es = dtype_size(out_dtype);
  const bool col = args.b_layout == BLayout::kColMajor;
  const int dim = ag ? (args.gather_last ? -1 : 0) : (args.scatter_last ? -1 : 0);
  // Every rank's inputs come from seeds, so the reference needs no communication.
  const int64_t kl = K / ws;
  const reference::GenMatrix gen_a = ag ? (args.gather_last ? reference::GenMatrix{11, 0, kl}
                                                             : reference::GenMatrix{11, M / ws, 0})
                                        : reference::GenMatrix{11, 0, kl};
  const reference::GenMatrix gen_b = ag ? reference::GenMatrix{29, 0, 0} : reference::GenMatrix{29, kl, 0};

  // This rank's tensors.
  int64_t a_rows = M, a_cols = K, a_row0 = 0, a_col0 = 0, b_rows = K, b_row0 = 0;
  if (ag && !args.gather_last) a_rows = M / ws, a_row0 = r * a_rows;
  if (!ag || args.gather_last) a_cols = kl, a_col0 = r * kl;
  if (!ag) b_rows = kl, b_row0 = r * kl;
  int64_t out_rows = M, out_cols = N, out_row0 = 0, out_col0 = 0;
  if (!ag && !args.scatter_last) out_rows = M / ws, out_row0 = r * out_rows;
  if (!ag && args.scatter_last) out_cols = N / ws, out_col0 = r * out_cols;

  DeviceBuffer a(a_rows * a_cols * es, stream), b(b_rows * N * es, stream), out(out_rows * out_cols * out_es, stream);
  reference::fill(a.p, args.dtype, a_rows, a_cols, false, gen_a, a_row0, a_col0, stream);
  reference::fill(b.p, args.dtype, b_rows, N, col, gen_b, b_row0, 0, stream);
  const TensorRef ta = TensorRef::dense(a.p, args.dtype, {a_rows, a_cols});
  const TensorRef tb = col ? TensorRef::dense(b.p, args.dtype, {N, b_rows}) : TensorRef::dense(b.p, args.dtype, {b_rows, N});
  const TensorRef tout = TensorRef::dense(out.p, out_dtype, {out_rows, out_cols});

  // fp8's scales, the same on every rank: one per row of the whole A and one per column of B, or one each.
  const Fp8Scales scales(args, M, N, stream);
  DeviceBuffer ref(M * N * sizeof(float), stream);
  {
    DeviceBuffer a_full(M * K * sizeof(float), stream), b_full(K * N * sizeof(float), stream);
    if (scaled) {
      reference::fill_fp32_as(a_full.f(), args.dtype, M, K, gen_a, 0, 0, stream);
      reference::fill_fp32_as(b_full.f(), args.dtype, K, N, gen_b, 0, 0, stream);
      reference::scale(a_full.f(), M, K, scales.a(), scales.a_count, nullptr, 1, stream);
      reference::scale(b_full.f(), K, N, nullptr, 1, scales.b(), scales.b_count, stream);
    } else {
      reference::fill_fp32(a_full.f(), M, K, gen_a, 0, 0, stream);
      reference::fill_fp32(b_full.f(), K, N, gen_b, 0, 0, stream);
    }
    reference::Fp32Gemm().run(a_full.f(), b_full.f(), ref.f(), M, N, K, stream);
    ASYNCTP_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  // The bias: once in the all-gather's product, once a rank in the reduce-scatter's sum.
  const bool biased = scaled && args.bias;
  std::unique_ptr<Fp8Bias> bias = biased ? std::make_unique<Fp8Bias>(N, out_dtype, stream) : nullptr;
  if (biased) reference::add_row(ref.f(), M, N, bias->fp32.f(), static_cast<float>(ag ? 1 : ws), stream);
  const TensorRef tbias = biased ? TensorRef::dense(bias->values.p, out_dtype, {N}) : TensorRef{};
  const void* bias_data = biased ? bias->values.p : nullptr;
  // This rank's a_scale: row-wise along a gathered M its own rows (gathered with them), else every row.
  const bool own_rows = args.rowwise_scales && ag && !args.gather_last;
  const TensorRef ta_scale = !args.rowwise_scales ? TensorRef::dense(scales.a(), DType::kFP32, {1})
                             : own_rows ? TensorRef::dense(scales.a() + r * a_rows, DType::kFP32, {a_rows, 1})
                                        : TensorRef::dense(scales.a(), DType::kFP32, {M, 1});
  const TensorRef tb_scale = args.rowwise_scales ? TensorRef::dense(scales.b(), DType::kFP32, {1, N})
                                                 : TensorRef::dense(scales.b(), DType::kFP32, {1});

  // Baselines: the GEMM each GPU does, alone (cuBLAS, and where asked our kernel with every chunk in
  // place), and the collective alone. They are timed with the candidates, in turn.
  CaseResult result;
  std::vector<std::function<void()>> timed;
  std::vector<double*> results;
  const int64_t gm = M, gk = ag ? K : kl;
  DeviceBuffer ga(gm * gk * es, stream), gc(gm * N * out_es, stream), gb(gk * N * es, stream);
  reference::fill(ga.p, args.dtype, gm, gk, false, gen_a, 0, 0, stream);
  reference::fill(gb.p, args.dtype, gk, N, col, reference::GenMatrix{29, 0, 0}, 0, 0, stream);
  gemm::Problem p;
  p.M = gm, p.N = N, p.K = gk, p.dtype = args.dtype, p.b_layout = args.b_layout;
  gemm::GemmRunner& runner = algo::Resources::of(comm).gemm;
  if (scaled) {
    p.scaled = true, p.b_dtype = args.dtype, p.out_dtype = out_dtype, p.rowwise = args.rowwise_scales;
    p.fast_accum = args.fast_accum;
    const gemm::ScaledPointers pointers{scales.a(), scales.b(), bias_data};
    timed.push_back([&, pointers] { runner.run_scaled(p, ga.p, gb.p, pointers, gc.p, stream); });
  } else {
    timed.push_back([&] { runner.run(p, ga.p, gb.p, gc.p, stream); });
  }
  results.push_back(&result.gemm_us);
  kernels::fused::FusedGemmArgs g;
  g.dtype = element_of(args.dtype), g.out = element_of(out_dtype), g.b_layout = layout_of(args.b_layout), g.M = gm, g.N = N, g.K = gk;
  g.a = ga.p, g.b = gb.p, g.c = gc.p;
  // ag: rank 0's rows as its own (read from the same buffer), so that the tile width is the op's at this
  // world size (the widest tiles only at one rank: pick_tile_n).
  if (ag) g.a_local = ga.p, g.local_begin = 0, g.local_end = gm / ws;
  // rs: the partial GEMM with the reduce-scatter's tile width at this world size, no staging or reduction.
  if (!ag) {
    g.tile_n = algo::fused_rs_tile_n(ws, args.dtype, gm, N, gk, impl_of(comm).sm_budget,
                                     scaled && args.fast_accum && args.rowwise_scales);
  }
  // fp8: the fused kernel's fp8 form accumulates fast and takes a tensor-wise alpha from the device,
  // or row-wise scales: the all-gather's epilogue applies them; the reduce-scatter's kernel, where it has
  // peers, scales its whole tiles by them before the sum, which the kernel as the one rank of a
  // reduce-scatter (every tile its own, nothing to add) times.
  const bool fp8_fused = scaled && args.fast_accum;
  if (fp8_fused && args.rowwise_scales && ag) {
    g.row_scales = scales.a(), g.col_scales = scales.b();
  } else if (fp8_fused && args.rowwise_scales) {
    const auto tiles_n = static_cast<int32_t>((N + g.tile_n - 1) / g.tile_n);
    g.rs = kernels::fused::ReduceScatterTiles::one_rank(static_cast<int32_t>(gm), tiles_n);
    g.rs.row_scales = scales.a(), g.rs.col_scales = scales.b(), g.rs.cols = static_cast<int32_t>(N);
    g.rs.bias = bias_data;
  } else if (fp8_fused) {
    g.alpha_ptr = scales.product();
  }
  if (fp8_fused && g.rs.rank < 0) g.bias = bias_data;
  // A reduce-scatter's 128-wide tiles at an odd number of tile rows a rank run one-CTA clusters, which
  // only its own launch (rs.rank set) takes; a plain GEMM of that width above one tile row would run the
  // ping-pong schedule, so none is timed. (At an even number they run the ping-pong schedule too.)
  const bool rs_own_clusters = !ag && gm > kernels::fused::kTileRows &&
                               kernels::fused::reduce_scatter_one_cta_clusters(g.tile_n, gm / ws);
  if ((scaled ? fp8_fused : args.time_fused_gemm) && !rs_own_clusters && *kernels::fused::fused_gemm_unsupported(g) == '\0') {
    algo::attach_grid(comm, g, stream);
    timed.push_back([&] { kernels::fused::run_fused_gemm(g, stream); });
    results.push_back(&result.fused_gemm_us);
  }
  // The communication alone: the sequential algorithm's collective, through the communicator's transport.
  comm::Transport& transport = *impl_of(comm).transport;
  if (ag) {
    timed.push_back([&] { transport.all_gather(a.p, ga.p, static_cast<size_t>(a_rows) * a_cols * es, stream); });
  } else {
    timed.push_back([&] {
      transport.reduce_scatter(gc.p, out.p, static_cast<size_t>(out_rows) * out_cols, out_dtype, ReduceOp::kSum, stream);
    });
  }
  results.push_back(&result.comm_us);

  // Each candidate is checked first; only a correct one is timed.
  result.rows.reserve(candidates.size());
  for (const Candidate& cand : candidates) {
    result.rows.emplace_back();
    Row& row = result.rows.back();
    row.candidate = cand;
    if (r == 0 && progress) progress(cand);
    OpOptions options = cand.options;
    options.b_layout = args.b_layout;
    ScaledOpOptions scaled_options;
    scaled_options.algorithm = options.algorithm;
    scaled_options.chunks_per_rank = options.chunks_per_rank;
    scaled_options.use_fast_accum = args.fast_accum;
    auto call = [&, options, scaled_options] {
      if (scaled && ag) {
        all_gather_scaled_matmul(comm, ta, {tb}, ta_scale, {tb_scale}, dim, {tout}, TensorRef{}, stream, scaled_options,
                                 {tbias});
      } else if (scaled) {
        scaled_matmul_reduce_scatter(comm, ta, tb, ta_scale, tb_scale, dim, ReduceOp::kSum, tout, stream, scaled_options,
                                     tbias);
      } else if (ag) {
        all_gather_matmul(comm, ta, {tb}, dim, {tout}, TensorRef{}, stream, options);
      } else {
        matmul_reduce_scatter(comm, ta, tb, dim, ReduceOp::kSum, tout, stream, options);
      }
    };
    reference::poison(out.p, out_rows * out_cols * out_es, stream);
    // rs sums ws partial GEMMs of K / ws products each, rounded to the output type.
    const int terms = ag ? 1 : ws;
    const double tolerance = scaled && args.fast_accum
                                 ? reference::fast_accum_tolerance(out_dtype, terms, ag ? K : kl)
                                 : reference::tolerance(out_dtype, terms);
    try {
      call();
      const auto cmp = reference::compare(out.p, out_dtype, out_rows, out_cols, ref.f(), N, out_row0, out_col0, 1.0f,
                                          tolerance, stream);
      // Correct only where every rank's slice is.
      bool all_ok = true;
      for (const auto& v : ctx.allgather(std::to_string(cmp.ok()) + " " + std::to_string(cmp.max_abs_err))) {
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
  Timer timer(ctx, args, stream);
  const std::vector<double> medians = timer.medians_us(timed);
  for (size_t i = 0; i < medians.size(); ++i) *results[i] = medians[i];
  return result;
}

}  // namespace asynctp::bench
