// The scaled ops (asynctp/scaled_ops.h) against a reference computed another way: the fp8 inputs read
// back as fp32 (reference::fill_fp32_as), scaled by hand and multiplied by an fp32 GEMM. Tensor-wise
// and row-wise scales, every gather and scatter dim, bf16, fp16 and fp8 outputs (with and without a
// result scale), biases, e5m2 B, fast accumulation, several Bs and the gathered A, sequential,
// pipelined, fused and auto, at every world size (the
// reduce-scatter's tensor-wise scales differing by rank); the fused all-gather captured in a CUDA
// graph and replayed with new inputs and scales; auto following a tuning cache's fp8 entries; and the
// refusals the plan makes, on every rank.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <array>
#include <cstdio>
#include <string>
#include <vector>

#include "algo/fused.h"
#include "algo/overlap_resources.h"
#include "algo/resources.h"
#include "asynctp/scaled_ops.h"
#include "comm/communicator_impl.h"
#include "gemm/cublaslt_gemm.h"
#include "gpu_test.h"
#include "kernels/fused/tile_shape.h"
#include "ops_problems.h"
#include "ops_test_cases.h"
#include "tune/resolve.h"
#include "tuning_cache_file.h"

namespace asynctp {
namespace {

using testing::Buf;
using testing::contains;
using testing::make_comm;
using testing::next_case_seed;
using testing::ScopedEnv;
using testing::Stream;
using testing::executable_on_every_rank;
using reference::GenMatrix;

// Scales that differ from row to row (or column to column) and are exact in fp32: 0.5 to 1.25.
__global__ void fill_scales(float* s, int64_t n, int64_t first) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    s[i] = 0.5f + static_cast<float>((first + i) % 7) * 0.125f;
  }
}

// A bias over n columns, large beside the products (8 to 15 either way) so that an fp8 output's
// tolerance still sees one left out: `out` in bf16 or fp16, `ref` the same values in fp32.
template <typename T>
__global__ void fill_bias(T* out, float* ref, int64_t n, int64_t first) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const int64_t j = first + i;
    const float v = static_cast<float>(8 + j % 8) * (j % 2 ? -1.0f : 1.0f);
    out[i] = static_cast<T>(v);
    ref[i] = v;
  }
}

void bias(void* out, DType dtype, float* ref, int64_t n, int64_t first, cudaStream_t stream) {
  if (dtype == DType::kFP16) {
    fill_bias<<<32, 256, 0, stream>>>(static_cast<__half*>(out), ref, n, first);
  } else {
    fill_bias<<<32, 256, 0, stream>>>(static_cast<__nv_bfloat16*>(out), ref, n, first);
  }
  RANK_CUDA(cudaGetLastError());
}

// ref[i][j] += times * bias[j] for fp32 ref [rows, cols].
__global__ void add_bias(float* ref, int64_t rows, int64_t cols, const float* bias, float times) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    ref[i] += times * bias[i % cols];
  }
}

// An fp8 output's result scale: exact, and small enough that no output saturates.
float result_scale_of(int i) { return 0.75f - 0.25f * static_cast<float>(i % 2); }

// `n` scales, the global ones from `first` on (row-wise), or one value (tensor-wise: n = 1).
void scales(float* s, int64_t n, int64_t first, cudaStream_t stream) {
  fill_scales<<<32, 256, 0, stream>>>(s, n, first);
  RANK_CUDA(cudaGetLastError());
}

struct ScaledAgCase {
  int64_t rows_per_rank, K, N;
  bool gather_last, rowwise, return_a, fast_accum;
  int num_b;
  DType b_dtype, out_dtype;
  bool every_row = false;  // row-wise: a_scale holds every row of the gathered A, not this rank's only
  bool bias = false;       // a bias for every other B (bs[0], bs[2], ...): the others have none
  bool result_scale = false;  // an fp8 output's result scale (else none: 1)
};

std::string describe(const ScaledAgCase& c) {
  return detail::cat("scaled ag rows/rank=", c.rows_per_rank, " K=", c.K, " N=", c.N, c.gather_last ? " gather=last" : " gather=0",
                     c.rowwise ? (c.every_row ? " row-wise (every row)" : " row-wise") : " tensor-wise", c.return_a ? " return_a" : "", c.fast_accum ? " fast" : "",
                     " bs=", c.num_b, " B ", dtype_name(c.b_dtype), " out ", dtype_name(c.out_dtype),
                     c.bias ? " bias" : "", c.result_scale ? " result scale" : "");
}

// One all_gather_scaled_matmul problem on fixed buffers: fill() makes its inputs (from a seed, the
// scales shifted by `shift`) and the dequantised reference, call() runs the op, check() compares. A
// captured call replays on the same buffers, so fill() between replays gives each replay new inputs.
class ScaledAgProblem {
 public:
  ScaledAgProblem(const Communicator& comm, const ScaledAgCase& c)
      : c_(c),
        ws_(comm.world_size()),
        r_(comm.rank()),
        M_(c.gather_last ? c.rows_per_rank : c.rows_per_rank * ws_),
        m_(c.gather_last ? M_ : c.rows_per_rank),
        a_rows_(c.gather_last ? M_ : m_),
        a_cols_(c.gather_last ? c.K / ws_ : c.K),
        scale_rows_(c.rowwise ? (c.gather_last || c.every_row ? M_ : a_rows_) : 1),
        a_(a_rows_ * a_cols_),
        a_full_(M_ * c.K * 4),
        a_scale_local_(M_ * 4),
        a_scale_all_(M_ * 4),
        gathered_(M_ * c.K) {
    for (int i = 0; i < c.num_b; ++i) {
      const int64_t n = width(i);
      b_.push_back(std::make_unique<Buf>(c.K * n));
      b_scale_.push_back(std::make_unique<Buf>(n * 4));
      out_.push_back(std::make_unique<Buf>(M_ * n * dtype_size(c.out_dtype)));
      ref_.push_back(std::make_unique<Buf>(M_ * n * 4));
      bias_.push_back(std::make_unique<Buf>(n * 2));
      bias_ref_.push_back(std::make_unique<Buf>(n * 4));
      result_scale_.push_back(std::make_unique<Buf>(16));
    }
  }

  void fill(uint64_t seed, int64_t shift, cudaStream_t s, reference::Fp32Gemm& fp32) {
    const int64_t K = c_.K, kl = K / ws_;
    gen_a_ = c_.gather_last ? GenMatrix{seed, 0, kl} : GenMatrix{seed, m_, 0};
    reference::fill(a_.p, DType::kFP8E4M3, a_rows_, a_cols_, false, gen_a_, c_.gather_last ? 0 : r_ * m_,
                    c_.gather_last ? r_ * kl : 0, s);
    reference::fill_fp32_as(a_full_.f(), DType::kFP8E4M3, M_, K, gen_a_, 0, 0, s);
    // Row-wise: global row i's scale, this rank's rows from r * m (or every row, as gathered along K);
    // tensor-wise: one value on every rank.
    const bool every_row = scale_rows_ == M_;
    scales(a_scale_local_.f(), scale_rows_, shift + (c_.rowwise ? (every_row ? 0 : r_ * m_) : 3), s);
    scales(a_scale_all_.f(), c_.rowwise ? M_ : 1, shift + (c_.rowwise ? 0 : 3), s);
    reference::scale(a_full_.f(), M_, K, a_scale_all_.f(), c_.rowwise ? M_ : 1, nullptr, 1, s);
    for (int i = 0; i < c_.num_b; ++i) {
      const int64_t n = width(i);
      const GenMatrix gen_b{seed + 7 + i, 0, 0};
      reference::fill(b_[i]->p, c_.b_dtype, K, n, /*col_major=*/true, gen_b, 0, 0, s);
      Buf b_full(K * n * 4);
      reference::fill_fp32_as(b_full.f(), c_.b_dtype, K, n, gen_b, 0, 0, s);
      scales(b_scale_[i]->f(), c_.rowwise ? n : 1, shift + (c_.rowwise ? 2 * i : 5 + i), s);
      reference::scale(b_full.f(), K, n, nullptr, 1, b_scale_[i]->f(), c_.rowwise ? n : 1, s);
      fp32.run(a_full_.f(), b_full.f(), ref_[i]->f(), M_, n, K, s);
      if (has_bias(i)) {
        bias(bias_[i]->p, gemm::bias_dtype(c_.out_dtype), bias_ref_[i]->f(), n, shift + i, s);
        add_bias<<<64, 256, 0, s>>>(ref_[i]->f(), M_, n, bias_ref_[i]->f(), 1.0f);
        RANK_CUDA(cudaGetLastError());
      }
      const float result_scale = result_scale_of(i);
      RANK_CUDA(cudaMemcpyAsync(result_scale_[i]->p, &result_scale, 4, cudaMemcpyHostToDevice, s));
      reference::poison(out_[i]->p, M_ * n * dtype_size(c_.out_dtype), s);
      RANK_CUDA(cudaStreamSynchronize(s));
    }
  }

  void call(Communicator& comm, const ScaledOpOptions& algorithm, cudaStream_t s) {
    std::vector<TensorRef> bs, b_scales, outs, biases, result_scales;
    for (int i = 0; i < c_.num_b; ++i) {
      const int64_t n = width(i);
      bs.push_back(TensorRef::dense(b_[i]->p, c_.b_dtype, {n, c_.K}));
      b_scales.push_back(c_.rowwise ? TensorRef::dense(b_scale_[i]->p, DType::kFP32, {1, n})
                                    : TensorRef::dense(b_scale_[i]->p, DType::kFP32, {1}));
      outs.push_back(TensorRef::dense(out_[i]->p, c_.out_dtype, {M_, n}));
      biases.push_back(has_bias(i) ? TensorRef::dense(bias_[i]->p, gemm::bias_dtype(c_.out_dtype), {n}) : TensorRef{});
      result_scales.push_back(c_.result_scale ? TensorRef::dense(result_scale_[i]->p, DType::kFP32, {1}) : TensorRef{});
    }
    const TensorRef ta_scale = c_.rowwise ? TensorRef::dense(a_scale_local_.p, DType::kFP32, {scale_rows_, 1})
                                          : TensorRef::dense(a_scale_local_.p, DType::kFP32, {1});
    const TensorRef tg = c_.return_a ? TensorRef::dense(gathered_.p, DType::kFP8E4M3, {M_, c_.K}) : TensorRef{};
    ScaledOpOptions o = algorithm;
    o.use_fast_accum = c_.fast_accum;
    all_gather_scaled_matmul(comm, TensorRef::dense(a_.p, DType::kFP8E4M3, {a_rows_, a_cols_}), bs, ta_scale, b_scales,
                             c_.gather_last ? -1 : 0, outs, tg, s, o, biases, result_scales);
  }

  void check(const std::string& what, cudaStream_t s) {
    for (int i = 0; i < c_.num_b; ++i) {
      const int64_t n = width(i);
      const float scale = c_.result_scale ? result_scale_of(i) : 1.0f;
      const auto cmp = reference::compare(out_[i]->p, c_.out_dtype, M_, n, ref_[i]->f(), n, 0, 0, scale,
                                          reference::tolerance(c_.out_dtype, 1), s);
      RANK_CHECK(cmp.ok(), what, " ", describe(c_), ": output ", i, ": ", cmp.bad, " bad elements, max err ",
                 cmp.max_abs_err, " (max |ref| ", cmp.max_abs_ref, ")", cmp.where());
    }
    if (c_.return_a) {  // fp8 is compared through a byte-for-byte copy of what this rank filled, per shard
      Buf expect(M_ * c_.K);
      reference::fill(expect.p, DType::kFP8E4M3, M_, c_.K, false, gen_a_, 0, 0, s);
      std::vector<uint8_t> got(M_ * c_.K), want(M_ * c_.K);
      RANK_CUDA(cudaStreamSynchronize(s));
      RANK_CUDA(cudaMemcpy(got.data(), gathered_.p, M_ * c_.K, cudaMemcpyDeviceToHost));
      RANK_CUDA(cudaMemcpy(want.data(), expect.p, M_ * c_.K, cudaMemcpyDeviceToHost));
      RANK_CHECK(got == want, what, " ", describe(c_), ": the gathered A differs from every rank's shard");
    }
  }

 private:
  int64_t width(int i) const { return c_.N + 16 * i; }
  bool has_bias(int i) const { return c_.bias && i % 2 == 0; }

  ScaledAgCase c_;
  int ws_, r_;
  int64_t M_, m_, a_rows_, a_cols_, scale_rows_;
  GenMatrix gen_a_{};
  Buf a_, a_full_, a_scale_local_, a_scale_all_, gathered_;
  std::vector<std::unique_ptr<Buf>> b_, b_scale_, out_, ref_, bias_, bias_ref_, result_scale_;
};

void run_scaled_ag_case(Communicator& comm, const ScaledAgCase& c, const ScaledOpOptions& algorithm, cudaStream_t s,
                        reference::Fp32Gemm& fp32) {
  ScaledAgProblem problem(comm, c);
  problem.fill(next_case_seed(), 0, s, fp32);
  problem.call(comm, algorithm, s);
  problem.check(algorithm_name(algorithm.algorithm), s);
}

// Each rank's tensor-wise scales differ: 0.5 to 1.25 by rank for a_scale, another step for b_scale.
__host__ __device__ float rank_a_scale(int64_t rank) { return 0.5f + static_cast<float>((2 + rank) % 7) * 0.125f; }
__host__ __device__ float rank_b_scale(int64_t rank) { return 0.5f + static_cast<float>((4 + 2 * rank) % 7) * 0.125f; }

// The whole A's column k belongs to rank k / k_local, whose partial product is scaled by its own
// a_scale * b_scale.
__global__ void fill_rank_column_scales(float* s, int64_t K, int64_t k_local) {
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < K; k += gridDim.x * blockDim.x) {
    s[k] = rank_a_scale(k / k_local) * rank_b_scale(k / k_local);
  }
}

// The row-wise reduce-scatter's reference inputs, A [M, K] and B [K, N] in fp32 (row-major): each of
// A's columns and B's rows k scaled by the row-wise scales of the rank that holds it (k / k_local),
// whose a_scale and b_scale are a_scales[rank][M] and b_scales[rank][N].
__global__ void scale_by_rank(float* a, float* b, int64_t M, int64_t N, int64_t K, int64_t k_local, const float* a_scales,
                              const float* b_scales) {
  const int64_t stride = gridDim.x * static_cast<int64_t>(blockDim.x);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < M * K; i += stride) {
    a[i] *= a_scales[(i % K) / k_local * M + i / K];
  }
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < K * N; i += stride) {
    b[i] *= b_scales[i / N / k_local * N + i % N];
  }
}

// Rank q's row-wise scales, each rank's its own.
int64_t rank_a_scales_first(int q) { return 5 * q; }
int64_t rank_b_scales_first(int q) { return 3 + 2 * q; }

struct ScaledRsCase {
  int64_t M, N, K;
  bool scatter_last, rowwise;
  ReduceOp reduce;
  DType out_dtype;
  bool fast_accum = false;
  bool bias = false;          // added to every rank's partial: the sum counts it once a rank
  bool result_scale = false;  // an fp8 output's (else none: 1)
};

void run_scaled_rs_case(Communicator& comm, const ScaledRsCase& c, const ScaledOpOptions& options, cudaStream_t s,
                        reference::Fp32Gemm& fp32) {
  const int ws = comm.world_size(), r = comm.rank();
  const int64_t kl = c.K / ws;
  const uint64_t seed = next_case_seed();
  const GenMatrix gen_a{seed, 0, kl}, gen_b{seed + 1, kl, 0};
  Buf a(c.M * kl), b(kl * c.N), a_full(c.M * c.K * 4), b_full(c.K * c.N * 4), ref(c.M * c.N * 4), sa(c.M * 4), sb(c.N * 4);
  Buf every_sa(c.rowwise ? ws * c.M * 4 : 4), every_sb(c.rowwise ? ws * c.N * 4 : 4);
  reference::fill(a.p, DType::kFP8E4M3, c.M, kl, false, gen_a, 0, r * kl, s);
  reference::fill(b.p, DType::kFP8E4M3, kl, c.N, /*col_major=*/true, gen_b, r * kl, 0, s);
  reference::fill_fp32_as(a_full.f(), DType::kFP8E4M3, c.M, c.K, gen_a, 0, 0, s);
  reference::fill_fp32_as(b_full.f(), DType::kFP8E4M3, c.K, c.N, gen_b, 0, 0, s);
  if (c.rowwise) {
    // Each rank's own: the sum over ranks scales each rank's columns of A and rows of B by its scales.
    for (int q = 0; q < ws; ++q) {
      scales(every_sa.f() + q * c.M, c.M, rank_a_scales_first(q), s);
      scales(every_sb.f() + q * c.N, c.N, rank_b_scales_first(q), s);
    }
    scales(sa.f(), c.M, rank_a_scales_first(r), s);
    scales(sb.f(), c.N, rank_b_scales_first(r), s);
    scale_by_rank<<<64, 256, 0, s>>>(a_full.f(), b_full.f(), c.M, c.N, c.K, kl, every_sa.f(), every_sb.f());
    RANK_CUDA(cudaGetLastError());
  } else {
    // Each rank's own: the sum over ranks weighs each rank's columns of the whole A by its scales.
    const float mine[2] = {rank_a_scale(r), rank_b_scale(r)};
    RANK_CUDA(cudaMemcpyAsync(sa.f(), &mine[0], 4, cudaMemcpyHostToDevice, s));
    RANK_CUDA(cudaMemcpyAsync(sb.f(), &mine[1], 4, cudaMemcpyHostToDevice, s));
    Buf columns(c.K * 4);
    fill_rank_column_scales<<<32, 256, 0, s>>>(columns.f(), c.K, kl);
    RANK_CUDA(cudaGetLastError());
    reference::scale(a_full.f(), c.M, c.K, nullptr, 1, columns.f(), c.K, s);
    RANK_CUDA(cudaStreamSynchronize(s));
  }
  fp32.run(a_full.f(), b_full.f(), ref.f(), c.M, c.N, c.K, s);
  const DType bias_dtype = gemm::bias_dtype(c.out_dtype);
  Buf bias_buf(c.N * 2), bias_ref(c.N * 4), result_scale(16);
  if (c.bias) {
    bias(bias_buf.p, bias_dtype, bias_ref.f(), c.N, 0, s);
    add_bias<<<64, 256, 0, s>>>(ref.f(), c.M, c.N, bias_ref.f(), static_cast<float>(ws));
    RANK_CUDA(cudaGetLastError());
  }
  const float result_scale_value = result_scale_of(1);
  RANK_CUDA(cudaMemcpyAsync(result_scale.p, &result_scale_value, 4, cudaMemcpyHostToDevice, s));
  const int64_t out_rows = c.scatter_last ? c.M : c.M / ws, out_cols = c.scatter_last ? c.N / ws : c.N;
  const size_t es = dtype_size(c.out_dtype);
  Buf out(out_rows * out_cols * es);
  reference::poison(out.p, out_rows * out_cols * es, s);
  RANK_CUDA(cudaStreamSynchronize(s));
  const TensorRef ta_scale = c.rowwise ? TensorRef::dense(sa.p, DType::kFP32, {c.M, 1}) : TensorRef::dense(sa.p, DType::kFP32, {1});
  const TensorRef tb_scale = c.rowwise ? TensorRef::dense(sb.p, DType::kFP32, {1, c.N}) : TensorRef::dense(sb.p, DType::kFP32, {1});
  ScaledOpOptions o = options;
  o.use_fast_accum = c.fast_accum;
  scaled_matmul_reduce_scatter(comm, TensorRef::dense(a.p, DType::kFP8E4M3, {c.M, kl}),
                               TensorRef::dense(b.p, DType::kFP8E4M3, {c.N, kl}), ta_scale, tb_scale,
                               c.scatter_last ? -1 : 0, c.reduce, TensorRef::dense(out.p, c.out_dtype, {out_rows, out_cols}), s, o,
                               c.bias ? TensorRef::dense(bias_buf.p, bias_dtype, {c.N}) : TensorRef{},
                               c.result_scale ? TensorRef::dense(result_scale.p, DType::kFP32, {1}) : TensorRef{});
  const float scale = (c.reduce == ReduceOp::kAvg ? 1.0f / ws : 1.0f) * (c.result_scale ? result_scale_value : 1.0f);
  const auto cmp = reference::compare(out.p, c.out_dtype, out_rows, out_cols, ref.f(), c.N, c.scatter_last ? 0 : r * out_rows,
                                      c.scatter_last ? r * out_cols : 0, scale, reference::tolerance(c.out_dtype, ws), s);
  RANK_CHECK(cmp.ok(), algorithm_name(o.algorithm), " scaled rs M=", c.M, " N=", c.N, " K=", c.K, c.scatter_last ? " scatter=last" : " scatter=0",
             c.rowwise ? " row-wise (each rank's)" : " tensor-wise (each rank's)", c.fast_accum ? " fast" : "",
             c.reduce == ReduceOp::kAvg ? " avg " : " sum ", dtype_name(c.out_dtype), c.bias ? " bias" : "",
             c.result_scale ? " result scale" : "", ": ", cmp.bad, " bad elements, max err ", cmp.max_abs_err, cmp.where());
}

// Reduce-scatters the fused kernel's fp8 form takes (e4m3, fast accumulation, bf16 or fp16 out,
// tensor-wise and row-wise scales, each rank's own; an fp8 output tensor-wise): 256 and 512 rows a rank, N not a multiple of the tile (the
// ping-pong schedule's, reduced in its epilogue), and 3072 rows a rank of 2048 columns at K of 8448 a rank (the cooperative
// kernel's 256-wide tiles, reduced in fixup(); past K = 8192, where fp8_pingpong_fills_better would give some world sizes
// the ping-pong schedule) and, row-wise, at K of 8192 a rank (the ping-pong schedule: rowwise_rs_pingpong_takes), each with and without a bias (an fp16 or fp8 output at
// K of 128 a rank, the ping-pong's: at 8192 the sequential algorithm's fp16 results fall outside the tolerance); under `fused`, a check
// that every one of them on more than one rank ran the fused kernel, and on two ranks at 4096 rows a
// rank (768 tiles: five rounds), its reduction in the epilogue.
int fused_kernel_rs_cases(RankContext& ctx, Communicator& comm, const ScaledOpOptions& o, cudaStream_t s,
                          reference::Fp32Gemm& fp32) {
  const int ws = ctx.world_size;
  // The fused reductions so far, in both ways or in the epilogue (none before the first overlapped call).
  const auto reductions = [&comm](bool epilogue_only) -> int64_t {
    const algo::OverlapResources* pr = algo::Resources::of(comm).overlap.get();
    if (pr == nullptr) return 0;
    return static_cast<int64_t>(pr->fused_reductions(true) + (epilogue_only ? 0 : pr->fused_reductions(false)));
  };
  const int64_t reductions_before = reductions(false), epilogue_before = reductions(true);
  const int sms = impl_of(comm).sm_budget;
  for (const auto [M, N, kl] : {std::array<int64_t, 3>{256 * ws, 336, 64}, std::array<int64_t, 3>{512 * ws, 256, 256}}) {
    RANK_CHECK(ws == 1 || algo::fused_rs_tile_n(ws, DType::kFP8E4M3, M, N, kl, sms) == kernels::fused::kPingpongTileN,
               M, "x", N, "x", kl * ws, " on ", ws, " ranks of ", sms, " SMs: not the ping-pong schedule");
  }
  RANK_CHECK(ws == 1 || algo::fused_rs_tile_n(ws, DType::kFP8E4M3, 3072 * ws, 2048, 8448, sms) == 256, 3072 * ws,
             "x2048 on ", ws, " ranks of ", sms, " SMs: not 256-wide tiles");
  // Row-wise at K of 8192 a rank: the ping-pong schedule (rowwise_rs_pingpong_takes) where the ranks
  // reduce in fixup(); two ranks reduce these in the epilogue.
  RANK_CHECK(ws <= 2 || algo::fused_rs_tile_n(ws, DType::kFP8E4M3, 3072 * ws, 2048, 8192, sms, true) ==
                            kernels::fused::kPingpongTileN,
             3072 * ws, "x2048 row-wise on ", ws, " ranks of ", sms, " SMs: not the ping-pong schedule");
  int n = 0;
  for (const bool rowwise : {false, true}) {
    for (const ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
      run_scaled_rs_case(comm, ScaledRsCase{256 * ws, 336, 64 * ws, false, rowwise, op, DType::kBF16, true}, o, s, fp32);
      run_scaled_rs_case(comm, ScaledRsCase{512 * ws, 256, 256 * ws, false, rowwise, op, DType::kBF16, true}, o, s, fp32);
      n += 2;
    }
    run_scaled_rs_case(comm, ScaledRsCase{3072 * ws, 2048, 8448 * ws, false, rowwise, ReduceOp::kSum, DType::kBF16, true}, o,
                       s, fp32);
    ++n;
    // A bias, added to every rank's partial product after its scales: the ping-pong's and 256-wide tiles.
    for (const ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
      run_scaled_rs_case(comm, ScaledRsCase{256 * ws, 336, 64 * ws, false, rowwise, op, DType::kBF16, true, true}, o, s,
                         fp32);
      ++n;
    }
    run_scaled_rs_case(comm, ScaledRsCase{3072 * ws, 2048, 8448 * ws, false, rowwise, ReduceOp::kSum, DType::kBF16, true, true},
                       o, s, fp32);
    ++n;
    if (rowwise) {
      run_scaled_rs_case(comm, ScaledRsCase{3072 * ws, 2048, 8192 * ws, false, true, ReduceOp::kSum, DType::kBF16, true, true},
                         o, s, fp32);
      ++n;
    }
    // An fp16 output (and bias): staged, reduced and stored in fp16.
    run_scaled_rs_case(comm, ScaledRsCase{256 * ws, 336, 64 * ws, false, rowwise, ReduceOp::kSum, DType::kFP16, true, true}, o,
                       s, fp32);
    run_scaled_rs_case(comm, ScaledRsCase{3072 * ws, 2048, 128 * ws, false, rowwise, ReduceOp::kAvg, DType::kFP16, true}, o,
                       s, fp32);
    n += 2;
  }
  // An fp8 output (tensor-wise scales: the plan's rule), with a result scale and a bias, and without
  // either: the kernel's bf16 sum, rounded to it after.
  run_scaled_rs_case(comm, ScaledRsCase{256 * ws, 336, 64 * ws, false, false, ReduceOp::kSum, DType::kFP8E4M3, true, true, true},
                     o, s, fp32);
  run_scaled_rs_case(comm, ScaledRsCase{3072 * ws, 2048, 128 * ws, false, false, ReduceOp::kAvg, DType::kFP8E4M3, true}, o, s,
                     fp32);
  n += 2;
  const bool epilogue_way = ws == 2 && o.algorithm == Algorithm::kFused;
  if (epilogue_way) {
    for (const bool rowwise : {false, true}) {
      run_scaled_rs_case(comm, ScaledRsCase{8192, 3072, 128, false, rowwise, ReduceOp::kAvg, DType::kBF16, true}, o, s, fp32);
      run_scaled_rs_case(comm, ScaledRsCase{8192, 3072, 128, false, rowwise, ReduceOp::kSum, DType::kBF16, true, true}, o, s,
                         fp32);
      run_scaled_rs_case(comm, ScaledRsCase{8192, 3072, 128, false, rowwise, ReduceOp::kSum, DType::kFP16, true, true}, o, s,
                         fp32);
      n += 3;
    }
    run_scaled_rs_case(comm, ScaledRsCase{8192, 3072, 128, false, false, ReduceOp::kSum, DType::kFP8E4M3, true, true, true}, o, s,
                       fp32);
    ++n;
  }
  if (o.algorithm == Algorithm::kFused && ws > 1) {
    const int64_t fused = reductions(false) - reductions_before, epilogue = reductions(true) - epilogue_before;
    RANK_CHECK(fused == n, "fused scaled reduce-scatters ", fused, " of ", n, "; every one was to run the fused kernel");
    // At least the 8192-row cases: the rule goes by tiles, so a smaller case in the epilogue means those too.
    RANK_CHECK(!epilogue_way || epilogue >= 2, "reduced in the epilogue ", epilogue, "; the 8192-row cases were to");
  }
  return n;
}

// Biases (on every other B) and fp8 outputs, with and without a result scale: cuBLASLt's epilogue
// in sequential and pipelined (fused runs those with fast accumulation itself, where the unscaled op
// would run fused, and the rest pipelined), the reduce-scatter's bias once a rank and its fp8 output
// rounded once after a bf16 sum.
int epilogue_cases(Communicator& comm, const ScaledOpOptions& o, cudaStream_t s, reference::Fp32Gemm& fp32) {
  const int ws = comm.world_size();
  constexpr DType kE4M3 = DType::kFP8E4M3, kBF16 = DType::kBF16, kFP16 = DType::kFP16;
  int n = 0;
  auto ag = [&](ScaledAgCase c, bool bias, bool result_scale) {
    c.bias = bias, c.result_scale = result_scale;
    run_scaled_ag_case(comm, c, o, s, fp32);
    ++n;
  };
  ag(ScaledAgCase{33, 128, 80, false, false, false, true, 3, kE4M3, kBF16}, true, false);
  ag(ScaledAgCase{64, 256, 128, false, false, true, false, 2, kE4M3, kFP16}, true, false);
  ag(ScaledAgCase{64, 256, 128, false, true, false, false, 2, kE4M3, kBF16}, true, false);  // row-wise
  ag(ScaledAgCase{33, 128, 80, false, false, false, true, 2, kE4M3, kE4M3}, true, true);
  ag(ScaledAgCase{64, 256, 96, false, false, true, false, 1, kE4M3, kE4M3}, false, false);  // result scale 1
  ag(ScaledAgCase{48, 64 * ws, 160, true, false, true, false, 2, kE4M3, kE4M3}, true, true);  // along K
  for (const bool last : {false, true}) {
    for (const ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
      ScaledRsCase bf16{64 * ws, 32 * ws, 48 * ws, last, false, op, kBF16, false, true, false};
      run_scaled_rs_case(comm, bf16, o, s, fp32);
      ScaledRsCase fp8{64 * ws, 32 * ws, 48 * ws, last, false, op, kE4M3, op == ReduceOp::kSum, true, true};
      run_scaled_rs_case(comm, fp8, o, s, fp32);
      n += 2;
    }
  }
  run_scaled_rs_case(comm, ScaledRsCase{64 * ws, 32 * ws, 48 * ws, false, true, ReduceOp::kSum, kFP16, false, true},
                     o, s, fp32);  // row-wise, an fp16 bias
  run_scaled_rs_case(comm, ScaledRsCase{64 * ws, 32 * ws, 48 * ws, true, false, ReduceOp::kSum, kE4M3}, o, s, fp32);
  return n + 2;
}

int every_scaled_case(RankContext& ctx) {
  auto comm = make_comm(ctx);
  Stream st;
  reference::Fp32Gemm fp32;
  const int ws = ctx.world_size;
  int n = 0;
  // Sequential, pipelined in two chunks per rank (a chunk of 33 rows is cut unevenly), and fused: the
  // fused kernel's fp8 form where the scales are tensor-wise with fast accumulation, else pipelined.
  // auto: the model's choice (sequential at shapes this small).
  ScaledOpOptions sequential, pipelined, fused, automatic;
  sequential.algorithm = Algorithm::kSequential;
  pipelined.algorithm = Algorithm::kPipelined;
  pipelined.chunks_per_rank = 2;
  fused.algorithm = Algorithm::kFused;
  automatic.algorithm = Algorithm::kAuto;
  for (const ScaledOpOptions& o : {sequential, pipelined, fused, automatic}) {
    // With fast accumulation and a bf16 or fp16 output, the fused kernel's: tensor-wise and row-wise (this
    // rank's rows' scales, gathered with them, or every row's); 33 rows a rank put tiles across ranks, one
    // row a rank makes one tile row.
    const algo::OverlapResources* pr = algo::Resources::of(*comm).overlap.get();
    const uint64_t gathers_before = pr != nullptr ? pr->fused_gathers() : 0;
    int fused_cases = 0;
    for (const bool rowwise : {false, true}) {
      run_scaled_ag_case(*comm, ScaledAgCase{33, 128, 80, false, rowwise, false, true, 1, DType::kFP8E4M3, DType::kBF16},
                         o, st.s, fp32);
      run_scaled_ag_case(*comm, ScaledAgCase{256, 512, 384, false, rowwise, true, true, 2, DType::kFP8E4M3, DType::kBF16},
                         o, st.s, fp32);
      run_scaled_ag_case(*comm, ScaledAgCase{1, 256, 272, false, rowwise, false, true, 1, DType::kFP8E4M3, DType::kBF16},
                         o, st.s, fp32);
      n += 3, fused_cases += 3;
    }
    run_scaled_ag_case(*comm, ScaledAgCase{96, 256, 336, false, true, true, true, 2, DType::kFP8E4M3, DType::kBF16, true},
                       o, st.s, fp32);
    ++n, ++fused_cases;
    // A bias on every other B, added by the fused kernel's epilogue after the scales (the others none).
    for (const bool rowwise : {false, true}) {
      run_scaled_ag_case(
          *comm, ScaledAgCase{33, 128, 80, false, rowwise, false, true, 3, DType::kFP8E4M3, DType::kBF16, false, true},
          o, st.s, fp32);
      run_scaled_ag_case(
          *comm, ScaledAgCase{256, 512, 384, false, rowwise, true, true, 2, DType::kFP8E4M3, DType::kBF16, false, true},
          o, st.s, fp32);
      n += 2, fused_cases += 2;
    }
    // An fp16 output (and an fp16 bias on every other B).
    for (const bool rowwise : {false, true}) {
      run_scaled_ag_case(*comm, ScaledAgCase{33, 128, 80, false, rowwise, false, true, 1, DType::kFP8E4M3, DType::kFP16},
                         o, st.s, fp32);
      run_scaled_ag_case(
          *comm, ScaledAgCase{256, 512, 384, false, rowwise, true, true, 3, DType::kFP8E4M3, DType::kFP16, false, true},
          o, st.s, fp32);
      n += 2, fused_cases += 2;
    }
    // An fp8 output (tensor-wise scales: the plan's rule), with a result scale and a bias on every other
    // B, and without either: each B's bf16 product, rounded to it after.
    run_scaled_ag_case(
        *comm, ScaledAgCase{33, 128, 80, false, false, false, true, 3, DType::kFP8E4M3, DType::kFP8E4M3, false, true, true},
        o, st.s, fp32);
    run_scaled_ag_case(*comm, ScaledAgCase{256, 512, 384, false, false, true, true, 1, DType::kFP8E4M3, DType::kFP8E4M3},
                       o, st.s, fp32);
    n += 2, fused_cases += 2;
    pr = algo::Resources::of(*comm).overlap.get();
    if (o.algorithm == Algorithm::kFused && ws > 1) {
      const uint64_t gathers = (pr != nullptr ? pr->fused_gathers() : 0) - gathers_before;
      RANK_CHECK(gathers == static_cast<uint64_t>(fused_cases), "fused scaled all-gathers whose kernels ran ", gathers,
                 " of ", fused_cases);
    }
    // K = 48 per rank gathers to 96-192 (multiples of 16); 33 rows per rank and N = 80 are odd for the tiles.
    for (const bool rowwise : {false, true}) {
      for (const DType out : {DType::kBF16, DType::kFP16}) {
        run_scaled_ag_case(*comm, ScaledAgCase{33, 128, 80, false, rowwise, false, false, 1, DType::kFP8E4M3, out}, o, st.s, fp32);
        run_scaled_ag_case(*comm, ScaledAgCase{256, 512, 384, false, rowwise, true, out == DType::kFP16, 2, DType::kFP8E4M3, out}, o, st.s, fp32);
        n += 2;
      }
      run_scaled_ag_case(*comm, ScaledAgCase{64, 256, 128, false, rowwise, false, false, 1, DType::kFP8E5M2, DType::kBF16}, o, st.s, fp32);
      ++n;
    }
    for (const bool rowwise : {false, true}) {  // gathered along K: a row-wise a_scale holds every row
      run_scaled_ag_case(*comm, ScaledAgCase{96, 48 * ws, 160, true, rowwise, true, false, 2, DType::kFP8E4M3, DType::kBF16},
                         o, st.s, fp32);
      ++n;
    }
    // Row-wise scales of every row of the gathered A, as PyTorch's pass passes them: nothing gathered.
    run_scaled_ag_case(*comm, ScaledAgCase{64, 128, 96, false, true, false, false, 1, DType::kFP8E4M3, DType::kBF16, true},
                       o, st.s, fp32);
    ++n;
    for (const bool rowwise : {false, true})
      for (const bool last : {false, true})
        for (const ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
          run_scaled_rs_case(*comm, ScaledRsCase{64 * ws, 32 * ws, 48 * ws, last, rowwise, op, last ? DType::kFP16 : DType::kBF16},
                             o, st.s, fp32);
          ++n;
        }
    n += fused_kernel_rs_cases(ctx, *comm, o, st.s, fp32);
    n += epilogue_cases(*comm, o, st.s, fp32);
  }
  std::printf("rank %d: %d scaled cases right\n", ctx.rank, n);
  return 0;
}

TEST(ScaledOps, EveryCaseMatchesTheDequantisedReference_1Rank) {
  REQUIRE_GPUS(1);
  RUN_RANKS(1, every_scaled_case);
}

TEST(ScaledOps, EveryCaseMatchesTheDequantisedReference_MultiRank) { RUN_EVERY_WORLD_SIZE(every_scaled_case); }

// The fused row-wise all-gather in the ping-pong schedule's 192-wide tiles, forced (the kernel takes
// them by itself only where they nearly fill their rounds, at sizes too large for every world size
// here: pingpong_192_takes): one and three chunks a rank, tiles across ranks (33 rows a rank), ragged N,
// every row's scales, a bias, an fp16 product.
int rowwise_pingpong_192_cases(RankContext& ctx) {
  auto comm = make_comm(ctx);
  Stream st;
  reference::Fp32Gemm fp32;
  int n = 0;
  for (const int chunks : {1, 3}) {
    ScaledOpOptions fused;
    fused.algorithm = Algorithm::kFused;
    fused.chunks_per_rank = chunks;
    run_scaled_ag_case(*comm, ScaledAgCase{256, 512, 384, false, true, true, true, 2, DType::kFP8E4M3, DType::kBF16},
                       fused, st.s, fp32);
    run_scaled_ag_case(*comm, ScaledAgCase{33, 128, 80, false, true, false, true, 1, DType::kFP8E4M3, DType::kBF16},
                       fused, st.s, fp32);
    run_scaled_ag_case(*comm, ScaledAgCase{384, 512, 592, false, true, false, true, 1, DType::kFP8E4M3, DType::kFP16,
                                           true, true},
                       fused, st.s, fp32);
    n += 3;
  }
  std::printf("rank %d: %d row-wise cases in 192-wide ping-pong tiles right\n", ctx.rank, n);
  return 0;
}

TEST(ScaledOps, RowWisePingpong192TilesMatchTheDequantisedReference_1Rank) {
  REQUIRE_GPUS(1);
  ScopedEnv forced("ASYNCTP_FUSED_TILE_N", "192");  // read by every rank's launches: set around them
  RUN_RANKS(1, rowwise_pingpong_192_cases);
}

TEST(ScaledOps, RowWisePingpong192TilesMatchTheDequantisedReference_MultiRank) {
  ScopedEnv forced("ASYNCTP_FUSED_TILE_N", "192");
  RUN_EVERY_WORLD_SIZE(rowwise_pingpong_192_cases);
}

// The fused fp8 all-gather captured in a CUDA graph, replayed with new inputs and scales each time:
// row-wise, this rank's scales are copied into the gathered inbox and pushed with the rows, so a replay
// that read the scales or rows of the capture would be wrong; tensor-wise, the scales are read in place.
int scaled_graph_replays(RankContext& ctx) {
  auto comm = make_comm(ctx);
  Stream st;
  reference::Fp32Gemm fp32;
  ScaledOpOptions fused;
  fused.algorithm = Algorithm::kFused;
  for (const bool rowwise : {true, false}) {
    ScaledAgProblem p(*comm, ScaledAgCase{256, 512, 384, false, rowwise, true, true, 2, DType::kFP8E4M3, DType::kBF16});
    p.fill(next_case_seed(), 0, st.s, fp32);
    p.call(*comm, fused, st.s);  // outside capture: streams, flags and the inbox are made here
    p.check("eager", st.s);
    const auto gathers = [&comm] {
      const algo::OverlapResources* pr = algo::Resources::of(*comm).overlap.get();
      return pr != nullptr ? pr->fused_gathers() : 0;
    };
    const uint64_t gathers_before = gathers();
    cudaGraph_t graph;
    RANK_CUDA(cudaStreamBeginCapture(st.s, cudaStreamCaptureModeThreadLocal));
    p.call(*comm, fused, st.s);
    RANK_CUDA(cudaStreamEndCapture(st.s, &graph));
    RANK_CHECK(ctx.world_size == 1 || gathers() == gathers_before + 1,
               "the captured call did not run the fused kernel");
    cudaGraphExec_t exec = executable_on_every_rank(ctx, graph, st.s);
    for (int i = 1; i <= 4; ++i) {
      p.fill(next_case_seed(), i, st.s, fp32);
      ctx.barrier();  // no rank replays (and pushes) before every rank's inputs are filled
      RANK_CUDA(cudaGraphLaunch(exec, st.s));
      p.check(detail::cat("replay ", i), st.s);
      ctx.barrier();  // nor refills while a peer's replay may still read them
    }
    RANK_CUDA(cudaGraphExecDestroy(exec));
    RANK_CUDA(cudaGraphDestroy(graph));
  }
  std::printf("rank %d: scaled replays right\n", ctx.rank);
  return 0;
}

TEST(ScaledOps, FusedCapturedGraphReplaysWithNewInputsAndScales_MultiRank) {
  RUN_EVERY_WORLD_SIZE(scaled_graph_replays);
}

// A tuning cache's "fp8 e4m3" entries are auto's choice for fp8 calls of their shapes (a bf16 entry of
// the same shape is not), and the calls are right.
int auto_follows_fp8_entries(RankContext& ctx) {
  const int ws = ctx.world_size;
  const int64_t ag_m = 256 * ws, ag_n = 384, ag_k = 512, rs_m = 64 * ws, rs_n = 32 * ws, rs_k = 48 * ws;
  const std::string path =
      testing::write_cache(ctx, {testing::choice_line(ctx, "ag", ag_m, ag_n, ag_k, "pipelined", 2, "fp8 e4m3"),
                                 testing::choice_line(ctx, "ag", ag_m, ag_n, ag_k, "fused", 1),
                                 testing::choice_line(ctx, "rs", rs_m, rs_n, rs_k, "pipelined", 2, "fp8 e4m3")});
  auto comm = testing::comm_with_cache(ctx, path);
  tune::ProblemKey key;
  key.op = tune::Op::kAllGatherMatmul, key.M = ag_m, key.N = ag_n, key.K = ag_k, key.dtype = DType::kFP8E4M3;
  key.world_size = ws, key.gpu = impl_of(*comm).gpu_name;
  tune::Choice c = tune::choose_for(*comm, key);
  RANK_CHECK(c.from_cache && c.algorithm == Algorithm::kPipelined && c.chunks_per_rank == 2, "fp8 ag: ", c.why);
  key.dtype = DType::kBF16;
  c = tune::choose_for(*comm, key);
  RANK_CHECK(c.from_cache && c.algorithm == Algorithm::kFused, "bf16 ag: ", c.why);
  key.op = tune::Op::kMatmulReduceScatter, key.M = rs_m, key.N = rs_n, key.K = rs_k, key.dtype = DType::kFP8E4M3;
  c = tune::choose_for(*comm, key);
  RANK_CHECK(c.from_cache && c.algorithm == Algorithm::kPipelined && c.chunks_per_rank == 2, "fp8 rs: ", c.why);
  Stream st;
  reference::Fp32Gemm fp32;
  ScaledOpOptions automatic;
  automatic.algorithm = Algorithm::kAuto;
  for (const bool rowwise : {false, true}) {
    run_scaled_ag_case(*comm, ScaledAgCase{256, ag_k, ag_n, false, rowwise, false, false, 1, DType::kFP8E4M3, DType::kBF16},
                       automatic, st.s, fp32);
    run_scaled_rs_case(*comm, ScaledRsCase{rs_m, rs_n, rs_k, false, rowwise, ReduceOp::kSum, DType::kBF16}, automatic,
                       st.s, fp32);
  }
  std::remove(path.c_str());
  return 0;
}

TEST(ScaledOps, AutoFollowsATuningCachesFp8Entries_MultiRank) { RUN_EVERY_WORLD_SIZE(auto_follows_fp8_entries); }

// A call the plan refuses on one rank only (row-major B there) fails on every rank, the others naming
// that rank, with the outputs untouched.
int refused_on_one_rank(RankContext& ctx) {
  auto comm = make_comm(ctx);
  Stream st;
  const int64_t out_elems = 64 * ctx.world_size * 256;
  Buf a(64 * 128), b(256 * 128), sa(16), sb(16), out(out_elems * 2);
  RANK_CUDA(cudaMemsetAsync(a.p, 0, 64 * 128, st.s));
  RANK_CUDA(cudaMemsetAsync(b.p, 0, 256 * 128, st.s));
  scales(sa.f(), 1, 0, st.s);
  scales(sb.f(), 1, 0, st.s);
  reference::poison(out.p, out_elems * 2, st.s);
  RANK_CUDA(cudaStreamSynchronize(st.s));
  ScaledOpOptions o;
  if (ctx.rank == 0) o.b_layout = BLayout::kRowMajor;
  std::string error = "<none>";
  try {
    const TensorRef tb = ctx.rank == 0 ? TensorRef::dense(b.p, DType::kFP8E4M3, {128, 256})
                                       : TensorRef::dense(b.p, DType::kFP8E4M3, {256, 128});
    all_gather_scaled_matmul(*comm, TensorRef::dense(a.p, DType::kFP8E4M3, {64, 128}), {tb},
                             TensorRef::dense(sa.p, DType::kFP32, {1}), {TensorRef::dense(sb.p, DType::kFP32, {1})}, 0,
                             {TensorRef::dense(out.p, DType::kBF16, {64 * ctx.world_size, 256})}, TensorRef{}, st.s, o);
  } catch (const Error& e) {
    error = e.what();
  }
  // Rank 0 says what it refused; the others name rank 0.
  const std::string expected = ctx.rank == 0 ? "column-major" : "rank 0 refused its arguments";
  RANK_CHECK(contains(error, expected), "expected '", expected, "', got: ", error);
  std::vector<uint16_t> host(out_elems);
  RANK_CUDA(cudaMemcpy(host.data(), out.p, host.size() * 2, cudaMemcpyDeviceToHost));
  for (const uint16_t v : host) RANK_CHECK(v == 0xFFFF, "the output was written by a refused call");
  return 0;
}

// Ranks whose row-wise a_scale differs in kind (this rank's rows on one, every row on the others)
// would not all gather it: every rank fails naming the difference, before any collective.
int row_wise_kinds_differ(RankContext& ctx) {
  auto comm = make_comm(ctx);
  Stream st;
  const int ws = ctx.world_size;
  Buf a(64 * 128), b(256 * 128), sa(64 * ws * 4), sb(256 * 4), out(64 * ws * 256 * 2);
  RANK_CUDA(cudaMemsetAsync(a.p, 0, 64 * 128, st.s));
  RANK_CUDA(cudaMemsetAsync(b.p, 0, 256 * 128, st.s));
  scales(sa.f(), 64 * ws, 0, st.s);
  scales(sb.f(), 256, 0, st.s);
  RANK_CUDA(cudaStreamSynchronize(st.s));
  const int64_t scale_rows = ctx.rank == 0 ? 64 * ws : 64;
  std::string error = "<none>";
  try {
    all_gather_scaled_matmul(*comm, TensorRef::dense(a.p, DType::kFP8E4M3, {64, 128}),
                             {TensorRef::dense(b.p, DType::kFP8E4M3, {256, 128})},
                             TensorRef::dense(sa.p, DType::kFP32, {scale_rows, 1}),
                             {TensorRef::dense(sb.p, DType::kFP32, {1, 256})}, 0,
                             {TensorRef::dense(out.p, DType::kBF16, {64 * ws, 256})}, TensorRef{}, st.s);
  } catch (const Error& e) {
    error = e.what();
  }
  RANK_CHECK(contains(error, "ranks disagree on a_scale gathered with A's rows"), "got: ", error);
  return 0;
}

TEST(ScaledOps, RanksWhoseRowWiseScalesDifferInKindFailTogether) { RUN_EVERY_WORLD_SIZE(row_wise_kinds_differ); }

TEST(ScaledOps, ARefusalOnOneRankFailsEveryRankWithTheOutputsUntouched) {
  RUN_EVERY_WORLD_SIZE(refused_on_one_rank);
}

}  // namespace
}  // namespace asynctp
