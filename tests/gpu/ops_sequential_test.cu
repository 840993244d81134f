// The ops with the sequential algorithm, against the reference (inputs regenerated from seeds on every
// rank, fp32 cuBLASLt GEMM): every option combination, odd shapes, 1 and 2 ranks; arguments that
// differ across ranks or are refused on one rank fail on every rank with the outputs untouched.
#include <vector>

#include "common/check.h"
#include "gpu_test.h"
#include "reference/reference.h"

namespace asynctp {
namespace {

using reference::GenMatrix;
using testing::make_comm;

struct Buf {
  void* p = nullptr;
  explicit Buf(size_t bytes) { RANK_CUDA(cudaMalloc(&p, bytes)); }
  ~Buf() { cudaFree(p); }
  float* f() const { return static_cast<float*>(p); }
};

// Row-major strides for `t`'s shape (TensorRef::dense takes a fixed list; these shapes are built up).
void make_dense(TensorRef& t) {
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

std::string describe(const AgCase& c) {
  std::string s = "ag A[";
  for (size_t i = 0; i < c.a_shape.size(); ++i) s += detail::cat(i ? "," : "", c.a_shape[i]);
  return s + detail::cat("] N=", c.N, c.gather_last ? " gather=last" : " gather=0", c.col_major ? " B=col" : " B=row",
                         c.return_a ? " return_a" : "", " bs=", c.num_b, " ", dtype_name(c.dtype));
}

void run_ag_case(Communicator& comm, const AgCase& c, cudaStream_t s, reference::Fp32Gemm& fp32) {
  const int ws = comm.world_size(), r = comm.rank();
  const size_t es = dtype_size(c.dtype);
  const int64_t K = c.a_shape.back();
  int64_t M = 1;
  for (size_t i = 0; i + 1 < c.a_shape.size(); ++i) M *= c.a_shape[i];
  const int64_t kl = K / ws, m = M / ws;
  const GenMatrix gen_a = c.gather_last ? GenMatrix{7, 0, kl} : GenMatrix{7, m, 0};
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
  OpOptions o;
  o.b_layout = c.col_major ? BLayout::kColMajor : BLayout::kRowMajor;
  all_gather_matmul(comm, ta, bs, c.gather_last ? -1 : 0, outs, tg, s, o);
  for (int i = 0; i < c.num_b; ++i) {
    const int64_t n = c.N + 8 * i;
    const auto cmp = reference::compare(outs[i].data, c.dtype, M, n, refs[i]->f(), n, 0, 0, 1.0f,
                                        reference::tolerance(c.dtype, 1), s);
    RANK_CHECK(cmp.ok(), describe(c), ": output ", i, ": ", cmp.bad, " bad elements, max err ", cmp.max_abs_err,
               " (max |ref| ", cmp.max_abs_ref, ")");
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

void run_rs_case(Communicator& comm, const RsCase& c, cudaStream_t s, reference::Fp32Gemm& fp32) {
  const int ws = comm.world_size(), r = comm.rank();
  const size_t es = dtype_size(c.dtype);
  const int64_t kl = c.K / ws;
  const GenMatrix gen_a{41, 0, kl}, gen_b{43, kl, 0};
  Buf a(c.M * kl * es), b(kl * c.N * es), a_full(c.M * c.K * 4), b_full(c.K * c.N * 4), ref(c.M * c.N * 4);
  reference::fill(a.p, c.dtype, c.M, kl, false, gen_a, 0, r * kl, s);
  reference::fill(b.p, c.dtype, kl, c.N, c.col_major, gen_b, r * kl, 0, s);
  reference::fill_fp32(a_full.f(), c.M, c.K, gen_a, 0, 0, s);
  reference::fill_fp32(b_full.f(), c.K, c.N, gen_b, 0, 0, s);
  fp32.run(a_full.f(), b_full.f(), ref.f(), c.M, c.N, c.K, s);
  const int64_t out_rows = c.scatter_last ? c.M : c.M / ws, out_cols = c.scatter_last ? c.N / ws : c.N;
  Buf out(out_rows * out_cols * es);
  reference::poison(out.p, out_rows * out_cols * es, s);
  // With batch dims, A is [2, M/2, K/world] and the output keeps them.
  const TensorRef ta = c.batch_dims ? TensorRef::dense(a.p, c.dtype, {2, c.M / 2, kl}) : TensorRef::dense(a.p, c.dtype, {c.M, kl});
  const TensorRef tb = c.col_major ? TensorRef::dense(b.p, c.dtype, {c.N, kl}) : TensorRef::dense(b.p, c.dtype, {kl, c.N});
  const TensorRef tout = c.batch_dims ? (c.scatter_last ? TensorRef::dense(out.p, c.dtype, {2, c.M / 2, out_cols})
                                                         : TensorRef::dense(out.p, c.dtype, {2 / ws, c.M / 2, out_cols}))
                                      : TensorRef::dense(out.p, c.dtype, {out_rows, out_cols});
  OpOptions o;
  o.b_layout = c.col_major ? BLayout::kColMajor : BLayout::kRowMajor;
  matmul_reduce_scatter(comm, ta, tb, c.scatter_last ? -1 : 0, c.reduce, tout, s, o);
  const float scale = c.reduce == ReduceOp::kAvg ? 1.0f / ws : 1.0f;
  const auto cmp = reference::compare(out.p, c.dtype, out_rows, out_cols, ref.f(), c.N, c.scatter_last ? 0 : r * out_rows,
                                      c.scatter_last ? r * out_cols : 0, scale, reference::tolerance(c.dtype, ws), s);
  RANK_CHECK(cmp.ok(), "rs M=", c.M, " N=", c.N, " K=", c.K, c.scatter_last ? " scatter=last" : " scatter=0",
             c.col_major ? " B=col" : " B=row", c.reduce == ReduceOp::kAvg ? " avg " : " sum ", dtype_name(c.dtype),
             c.batch_dims ? " batched" : "", ": ", cmp.bad, " bad elements, max err ", cmp.max_abs_err);
}

int every_combination(RankContext& ctx) {
  auto comm = make_comm(ctx);
  cudaStream_t s;
  RANK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  reference::Fp32Gemm fp32;
  const int ws = ctx.world_size;
  int n = 0;
  // Odd shapes: rows per rank 65 and N 200 are not multiples of 128; K 72 is not a multiple of 64.
  const std::vector<std::vector<int64_t>> a_shapes = {{256, 512}, {65 * ws, 72}, {2 * ws, 33, 72}};
  for (const auto& shape : a_shapes)
    for (bool last : {false, true})
      for (bool col : {false, true})
        for (bool ret : {false, true})
          for (int nb : {1, 3})
            for (DType dt : {DType::kBF16, DType::kFP16}) {
              run_ag_case(*comm, AgCase{shape, shape.back() == 512 ? 384 : 200, last, col, ret, nb, dt}, s, fp32);
              ++n;
            }
  for (const auto& [M, N, K] : std::vector<std::array<int64_t, 3>>{{256, 384, 512}, {130 * ws, 200, 72 * ws}})
    for (bool last : {false, true})
      for (bool col : {false, true})
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg})
          for (DType dt : {DType::kBF16, DType::kFP16})
            for (bool batch : {false, true}) {
              run_rs_case(*comm, RsCase{M, N, K, last, col, op, dt, batch}, s, fp32);
              ++n;
            }
  std::printf("rank %d: %d cases correct\n", ctx.rank, n);
  RANK_CUDA(cudaStreamDestroy(s));
  return 0;
}

TEST(SequentialOps, EveryCombination_1Rank) {
  REQUIRE_GPUS(1);
  RUN_RANKS(1, every_combination);
}

TEST(SequentialOps, EveryCombination_2Ranks) {
  REQUIRE_GPUS(2);
  RUN_RANKS(2, every_combination);
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Each rank's call must end in an Error containing `expect[rank]`, with its output still all 0x5A.
int expect_refused_everywhere(RankContext& ctx, bool shapes_differ) {
  auto comm = make_comm(ctx);
  cudaStream_t s;
  RANK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const int64_t m = (shapes_differ && ctx.rank == 1) ? 128 : 64;
  Buf a(m * 256 * 2 + 16), b(256 * 128 * 2), out(4 * m * 128 * 2);
  RANK_CUDA(cudaMemsetAsync(out.p, 0x5A, 4 * m * 128 * 2, s));
  TensorRef ta = TensorRef::dense(a.p, DType::kBF16, {m, 256});
  if (!shapes_differ && ctx.rank == 1) ta.data = static_cast<char*>(a.p) + 2;  // misaligned on rank 1 only
  std::string message;
  try {
    all_gather_matmul(*comm, ta, {TensorRef::dense(b.p, DType::kBF16, {256, 128})}, 0,
                      {TensorRef::dense(out.p, DType::kBF16, {2 * m, 128})}, TensorRef{}, s);
  } catch (const Error& e) {
    message = e.what();
  }
  std::printf("rank %d: %s\n", ctx.rank, message.c_str());
  if (shapes_differ) {
    RANK_CHECK(contains(message, "all_gather_matmul: ranks disagree on a.shape"), message);
  } else if (ctx.rank == 1) {
    RANK_CHECK(contains(message, "a_shard data pointer") && contains(message, "not 16-byte aligned"), message);
  } else {
    RANK_CHECK(contains(message, "all_gather_matmul: rank 1 refused its arguments"), message);
  }
  std::vector<unsigned char> host(4 * m * 128 * 2);
  RANK_CUDA(cudaMemcpyAsync(host.data(), out.p, host.size(), cudaMemcpyDeviceToHost, s));
  comm->synchronize(s);
  for (unsigned char v : host) RANK_CHECK(v == 0x5A, "the output was written to");
  // The communicator still works afterwards.
  comm->barrier(s);
  comm->synchronize(s);
  RANK_CUDA(cudaStreamDestroy(s));
  return 0;
}

TEST(SequentialOps, ShapesThatDifferAcrossRanksFailOnEveryRank) {
  REQUIRE_GPUS(2);
  RUN_RANKS(2, [](RankContext& ctx) { return expect_refused_everywhere(ctx, true); });
}

TEST(SequentialOps, ArgumentsRefusedOnOneRankFailOnEveryRank) {
  REQUIRE_GPUS(2);
  RUN_RANKS(2, [](RankContext& ctx) { return expect_refused_everywhere(ctx, false); });
}

TEST(SequentialOps, CapturedInACudaGraph) {
  REQUIRE_GPUS(2);
  RUN_RANKS(2, [](RankContext& ctx) {
    auto comm = make_comm(ctx);
    cudaStream_t s;
    RANK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    reference::Fp32Gemm fp32;
    const int64_t m = 256, K = 512, N = 384, M = m * ctx.world_size;
    Buf a(m * K * 2), b(K * N * 2), out(M * N * 2), a_full(M * K * 4), b_full(K * N * 4), ref(M * N * 4);
    reference::fill(a.p, DType::kBF16, m, K, false, GenMatrix{3, m, 0}, ctx.rank * m, 0, s);
    reference::fill(b.p, DType::kBF16, K, N, false, GenMatrix{5, 0, 0}, 0, 0, s);
    reference::fill_fp32(a_full.f(), M, K, GenMatrix{3, m, 0}, 0, 0, s);
    reference::fill_fp32(b_full.f(), K, N, GenMatrix{5, 0, 0}, 0, 0, s);
    fp32.run(a_full.f(), b_full.f(), ref.f(), M, N, K, s);
    const TensorRef ta = TensorRef::dense(a.p, DType::kBF16, {m, K});
    const TensorRef tb = TensorRef::dense(b.p, DType::kBF16, {K, N});
    const TensorRef to = TensorRef::dense(out.p, DType::kBF16, {M, N});
    all_gather_matmul(*comm, ta, {tb}, 0, {to}, TensorRef{}, s);  // first call outside: plans and scratch
    comm->synchronize(s);
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    RANK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    all_gather_matmul(*comm, ta, {tb}, 0, {to}, TensorRef{}, s);
    RANK_CUDA(cudaStreamEndCapture(s, &graph));
    RANK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    for (int i = 0; i < 20; ++i) {
      reference::poison(out.p, M * N * 2, s);
      RANK_CUDA(cudaGraphLaunch(exec, s));
      const auto cmp = reference::compare(out.p, DType::kBF16, M, N, ref.f(), N, 0, 0, 1.0f,
                                          reference::tolerance(DType::kBF16, 1), s);
      RANK_CHECK(cmp.ok(), "replay ", i, ": ", cmp.bad, " bad elements");
    }
    RANK_CUDA(cudaGraphExecDestroy(exec));
    RANK_CUDA(cudaGraphDestroy(graph));
    RANK_CUDA(cudaStreamDestroy(s));
    return 0;
  });
}

}  // namespace
}  // namespace asynctp
