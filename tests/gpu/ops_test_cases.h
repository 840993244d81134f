// Shared by the op tests: one all_gather_matmul or matmul_reduce_scatter case, run with given options
// and checked against the reference (inputs regenerated from seeds on every rank, fp32 GEMM).
#pragma once

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "common/check.h"
#include "gpu_test.h"
#include "reference/reference.h"

namespace asynctp::testing {

using reference::GenMatrix;

// Device memory for a case, allocated and freed in stream order on the thread's own stream: ranks that
// are threads of one process share the device, and cudaFree would wait for a peer's kernel that waits
// for this rank's next call. Every use is synchronized before the case ends.
struct Buf {
  void* p = nullptr;
  explicit Buf(size_t bytes) {
    RANK_CUDA(cudaMallocAsync(&p, bytes, cudaStreamPerThread));
    RANK_CUDA(cudaStreamSynchronize(cudaStreamPerThread));
  }
  ~Buf() { cudaFreeAsync(p, cudaStreamPerThread); }
  float* f() const { return static_cast<float*>(p); }
};

// Row-major strides for `t`'s shape (TensorRef::dense takes a fixed list; these shapes are built up).
inline void make_dense(TensorRef& t) {
  int64_t stride = 1;
  for (int d = t.ndim - 1; d >= 0; --d) t.strides[d] = stride, stride *= t.shape[d];
}

struct AgCase {
  std::vector<int64_t> a_shape;  // the global A: [d0, (d1,) K]
  int64_t N;
  bool gather_last, col_major, return_a;
  int num_b;
  DType dtype;
};

inline std::string describe(const AgCase& c) {
  std::string s = "ag A[";
  for (size_t i = 0; i < c.a_shape.size(); ++i) s += detail::cat(i ? "," : "", c.a_shape[i]);
  return s + detail::cat("] N=", c.N, c.gather_last ? " gather=last" : " gather=0", c.col_major ? " B=col" : " B=row",
                         c.return_a ? " return_a" : "", " bs=", c.num_b, " ", dtype_name(c.dtype));
}

// Inputs differ from case to case (the same sequence on every rank, whether ranks are processes or
// threads), so that rows a peer read before they landed, still holding the last case's values, cannot
// pass for right.
inline uint64_t next_case_seed() {
  thread_local uint64_t seed = 1000;
  return seed += 2;
}

// Runs the case with `o` (its algorithm and chunks; the layout comes from the case) and checks every
// output, and the gathered A where asked for, against the reference.
inline void run_ag_case(Communicator& comm, const AgCase& c, cudaStream_t s, reference::Fp32Gemm& fp32,
                        OpOptions o = {}) {
  const int ws = comm.world_size(), r = comm.rank();
  const size_t es = dtype_size(c.dtype);
  const int64_t K = c.a_shape.back();
  int64_t M = 1;
  for (size_t i = 0; i + 1 < c.a_shape.size(); ++i) M *= c.a_shape[i];
  const int64_t kl = K / ws, m = M / ws;
  const uint64_t seed = next_case_seed();
  const GenMatrix gen_a = c.gather_last ? GenMatrix{seed, 0, kl} : GenMatrix{seed, m, 0};
  // This rank's shard: rows [r*m, (r+1)*m) or columns [r*kl, (r+1)*kl).
  const int64_t a_rows = c.gather_last ? M : m, a_cols = c.gather_last ? kl : K;
  Buf a(a_rows * a_cols * es), a_full(M * K * 4), gathered(M * K * es);
  reference::fill(a.p, c.dtype, a_rows, a_cols, false, gen_a, c.gather_last ? 0 : r * m, c.gather_last ? r * kl : 0, s);
  reference::fill_fp32(a_full.f(), M, K, gen_a, 0, 0, s);
  TensorRef ta;
  ta.data = a.p;
  ta.dtype = c.dtype;
  ta.ndim = static_cast<int>(c.a_shape.size());
  for (int d = 0; d < ta.ndim; ++d) ta.shape[d] = c.a_shape[d];
  if (c.gather_last) ta.shape[ta.ndim - 1] = kl; else ta.shape[0] /= ws;
  make_dense(ta);

  std::vector<std::unique_ptr<Buf>> b_bufs, out_bufs, refs;
  std::vector<TensorRef> bs, outs;
  Buf b_full(K * c.N * 4);
  for (int i = 0; i < c.num_b; ++i) {
    const int64_t n = c.N + 8 * i;  // several Bs of different widths
    b_bufs.push_back(std::make_unique<Buf>(K * n * es));
    out_bufs.push_back(std::make_unique<Buf>(M * n * es));
    refs.push_back(std::make_unique<Buf>(M * n * 4));
    reference::fill(b_bufs[i]->p, c.dtype, K, n, c.col_major, GenMatrix{31u + i, 0, 0}, 0, 0, s);
    Buf bf(K * n * 4);
    reference::fill_fp32(bf.f(), K, n, GenMatrix{31u + i, 0, 0}, 0, 0, s);
    fp32.run(a_full.f(), bf.f(), refs[i]->f(), M, n, K, s);
    RANK_CUDA(cudaStreamSynchronize(s));
    bs.push_back(c.col_major ? TensorRef::dense(b_bufs[i]->p, c.dtype, {n, K}) : TensorRef::dense(b_bufs[i]->p, c.dtype, {K, n}));
    TensorRef o = ta;
    o.data = out_bufs[i]->p;
    if (c.gather_last) o.shape[o.ndim - 1] = n; else { o.shape[0] *= ws; o.shape[o.ndim - 1] = n; }
    make_dense(o);
    outs.push_back(o);
    reference::poison(o.data, o.bytes(), s);
  }
  TensorRef tg;
  if (c.return_a) {
    tg = ta;
    tg.data = gathered.p;
    if (c.gather_last) tg.shape[tg.ndim - 1] = K; else tg.shape[0] *= ws;
    make_dense(tg);
    reference::poison(gathered.p, M * K * es, s);
  }
  o.b_layout = c.col_major ? BLayout::kColMajor : BLayout::kRowMajor;
  all_gather_matmul(comm, ta, bs, c.gather_last ? -1 : 0, outs, tg, s, o);
  for (int i = 0; i < c.num_b; ++i) {
    const int64_t n = c.N + 8 * i;
    const auto cmp = reference::compare(outs[i].data, c.dtype, M, n, refs[i]->f(), n, 0, 0, 1.0f,
                                        reference::tolerance(c.dtype, 1), s);
    RANK_CHECK(cmp.ok(), algorithm_name(o.algorithm), " ", describe(c), ": output ", i, ": ", cmp.bad, " bad elements, max err ", cmp.max_abs_err,
               " (max |ref| ", cmp.max_abs_ref, ")", cmp.where());
  }
  if (c.return_a) {
    const auto cmp = reference::compare(gathered.p, c.dtype, M, K, a_full.f(), K, 0, 0, 1.0f, 0.0, s);
    RANK_CHECK(cmp.ok(), describe(c), ": gathered A: ", cmp.bad, " elements differ");
  }
}

struct RsCase {
  int64_t M, N, K;
  bool scatter_last, col_major;
  ReduceOp reduce;
  DType dtype;
  bool batch_dims;
};

inline void run_rs_case(Communicator& comm, const RsCase& c, cudaStream_t s, reference::Fp32Gemm& fp32,
                        OpOptions o = {}) {
  const int ws = comm.world_size(), r = comm.rank();
  const size_t es = dtype_size(c.dtype);
  const int64_t kl = c.K / ws;
  const uint64_t seed = next_case_seed();
  const GenMatrix gen_a{seed, 0, kl}, gen_b{seed + 1, kl, 0};
  Buf a(c.M * kl * es), b(kl * c.N * es), a_full(c.M * c.K * 4), b_full(c.K * c.N * 4), ref(c.M * c.N * 4);
  reference::fill(a.p, c.dtype, c.M, kl, false, gen_a, 0, r * kl, s);
  reference::fill(b.p, c.dtype, kl, c.N, c.col_major, gen_b, r * kl, 0, s);
  reference::fill_fp32(a_full.f(), c.M, c.K, gen_a, 0, 0, s);
  reference::fill_fp32(b_full.f(), c.K, c.N, gen_b, 0, 0, s);
  fp32.run(a_full.f(), b_full.f(), ref.f(), c.M, c.N, c.K, s);
  const int64_t out_rows = c.scatter_last ? c.M : c.M / ws, out_cols = c.scatter_last ? c.N / ws : c.N;
  Buf out(out_rows * out_cols * es);
  reference::poison(out.p, out_rows * out_cols * es, s);
  // With batch dims, A is [2*world, M/(2*world), K/world]; scattered along dim 0 each rank keeps 2 of
  // the leading entries, which are its M/world rows.
  const int64_t lead = 2 * ws, inner = c.M / lead;
  RANK_CHECK(!c.batch_dims || c.M % lead == 0, "a batched case needs M divisible by 2 * world size");
  const TensorRef ta = c.batch_dims ? TensorRef::dense(a.p, c.dtype, {lead, inner, kl}) : TensorRef::dense(a.p, c.dtype, {c.M, kl});
  const TensorRef tb = c.col_major ? TensorRef::dense(b.p, c.dtype, {c.N, kl}) : TensorRef::dense(b.p, c.dtype, {kl, c.N});
  const TensorRef tout = c.batch_dims ? (c.scatter_last ? TensorRef::dense(out.p, c.dtype, {lead, inner, out_cols})
                                                         : TensorRef::dense(out.p, c.dtype, {2, inner, out_cols}))
                                      : TensorRef::dense(out.p, c.dtype, {out_rows, out_cols});
  o.b_layout = c.col_major ? BLayout::kColMajor : BLayout::kRowMajor;
  matmul_reduce_scatter(comm, ta, tb, c.scatter_last ? -1 : 0, c.reduce, tout, s, o);
  const float scale = c.reduce == ReduceOp::kAvg ? 1.0f / ws : 1.0f;
  const auto cmp = reference::compare(out.p, c.dtype, out_rows, out_cols, ref.f(), c.N, c.scatter_last ? 0 : r * out_rows,
                                      c.scatter_last ? r * out_cols : 0, scale, reference::tolerance(c.dtype, ws), s);
  RANK_CHECK(cmp.ok(), algorithm_name(o.algorithm), " rs M=", c.M, " N=", c.N, " K=", c.K, c.scatter_last ? " scatter=last" : " scatter=0",
             c.col_major ? " B=col" : " B=row", c.reduce == ReduceOp::kAvg ? " avg " : " sum ", dtype_name(c.dtype),
             c.batch_dims ? " batched" : "", ": ", cmp.bad, " bad elements, max err ", cmp.max_abs_err, cmp.where());
}

// Every all_gather_matmul option combination with `o`'s algorithm: gather dim 0 and last, B row- and
// column-major, gathered A returned or not, one or three Bs, bf16 and fp16, on an aligned shape and two
// odd ones (rows per rank 65 and N 200 are not multiples of 128, K 72 not of 64; a 3-D A), at any world
// size up to 4. Returns how
// many cases ran.
inline int run_every_ag_combination(Communicator& comm, cudaStream_t s, reference::Fp32Gemm& fp32, const OpOptions& o) {
  const int ws = comm.world_size();
  int n = 0;
  // K divides among 2, 3 and 4 ranks for gather_dim last.
  const std::vector<std::vector<int64_t>> a_shapes = {{256 * ws, 192 * ws}, {65 * ws, 72}, {2 * ws, 33, 72}};
  for (const auto& shape : a_shapes)
    for (bool last : {false, true})
      for (bool col : {false, true})
        for (bool ret : {false, true})
          for (int nb : {1, 3})
            for (DType dt : {DType::kBF16, DType::kFP16}) {
              run_ag_case(comm, AgCase{shape, shape.back() == 72 ? 200 : 384, last, col, ret, nb, dt}, s, fp32, o);
              ++n;
            }
  return n;
}

inline bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace asynctp::testing
