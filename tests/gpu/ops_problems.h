// Shared by the op tests that run whole problems several times (back to back, graph replays): fixed
// shapes of each op whose inputs are regenerated from a seed, with their fp32 reference.
#pragma once

#include <chrono>
#include <functional>

#include "algo/resources.h"
#include "ops_test_cases.h"

namespace asynctp::testing {

struct Stream {
  cudaStream_t s = nullptr;
  Stream() { RANK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~Stream() { cudaStreamDestroy(s); }
};

// Keeps a stream busy for `ns`: what is enqueued behind it starts that much later on the GPU (rank
// skew, or an op that has not begun when its rank dies). One per test file (static).
static __global__ void hold_stream(long long ns) {
  long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    __nanosleep(100000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}

// A whole all_gather_matmul problem (gather_dim 0, bf16): this rank's shard, B, and the reference.
struct AgProblem {
  int64_t m, K, N, M;
  Buf b, ref;
  AgProblem(int ws, int64_t m_, int64_t K_, int64_t N_, cudaStream_t s)
      : m(m_), K(K_), N(N_), M(m_ * ws), b(K_ * N_ * 2), ref(m_ * ws * N_ * 4) {
    reference::fill(b.p, DType::kBF16, K, N, false, GenMatrix{5, 0, 0}, 0, 0, s);
  }
  // Writes this rank's shard of the A generated from `seed` into `a`, and the reference for it into `ref`.
  void make(uint64_t seed, int rank, void* a, float* ref_out, reference::Fp32Gemm& fp32, cudaStream_t s) {
    reference::fill(a, DType::kBF16, m, K, false, GenMatrix{seed, m, 0}, rank * m, 0, s);
    Buf a_full(M * K * 4), b_full(K * N * 4);
    reference::fill_fp32(a_full.f(), M, K, GenMatrix{seed, m, 0}, 0, 0, s);
    reference::fill_fp32(b_full.f(), K, N, GenMatrix{5, 0, 0}, 0, 0, s);
    fp32.run(a_full.f(), b_full.f(), ref_out, M, N, K, s);
    RANK_CUDA(cudaStreamSynchronize(s));
  }
  TensorRef a_ref(void* a) const { return TensorRef::dense(a, DType::kBF16, {m, K}); }
  TensorRef b_ref() const { return TensorRef::dense(b.p, DType::kBF16, {K, N}); }
  TensorRef out_ref(void* out) const { return TensorRef::dense(out, DType::kBF16, {M, N}); }
  void check(const void* out, const float* ref_in, const char* what, cudaStream_t s) const {
    const auto cmp = reference::compare(out, DType::kBF16, M, N, ref_in, N, 0, 0, 1.0f,
                                        reference::tolerance(DType::kBF16, 1), s);
    RANK_CHECK(cmp.ok(), what, ": ", cmp.bad, " bad elements, max err ", cmp.max_abs_err, cmp.where());
  }
};

// A whole matmul_reduce_scatter problem (scatter_dim 0, bf16, sum).
struct RsProblem {
  int64_t M, N, K, kl, rows;
  Buf b, ref;
  RsProblem(int ws, int rank, int64_t M_, int64_t N_, int64_t K_, cudaStream_t s)
      : M(M_), N(N_), K(K_), kl(K_ / ws), rows(M_ / ws), b(K_ / ws * N_ * 2), ref(M_ * N_ * 4) {
    reference::fill(b.p, DType::kBF16, kl, N, false, GenMatrix{43, kl, 0}, rank * kl, 0, s);
  }
  void make(uint64_t seed, int rank, void* a, float* ref_out, reference::Fp32Gemm& fp32, cudaStream_t s) {
    reference::fill(a, DType::kBF16, M, kl, false, GenMatrix{seed, 0, kl}, 0, rank * kl, s);
    Buf a_full(M * K * 4), b_full(K * N * 4);
    reference::fill_fp32(a_full.f(), M, K, GenMatrix{seed, 0, kl}, 0, 0, s);
    reference::fill_fp32(b_full.f(), K, N, GenMatrix{43, kl, 0}, 0, 0, s);
    fp32.run(a_full.f(), b_full.f(), ref_out, M, N, K, s);
    RANK_CUDA(cudaStreamSynchronize(s));
  }
  TensorRef a_ref(void* a) const { return TensorRef::dense(a, DType::kBF16, {M, kl}); }
  TensorRef b_ref() const { return TensorRef::dense(b.p, DType::kBF16, {kl, N}); }
  TensorRef out_ref(void* out) const { return TensorRef::dense(out, DType::kBF16, {rows, N}); }
  void check(const void* out, const float* ref_in, int rank, int ws, const char* what, cudaStream_t s) const {
    const auto cmp = reference::compare(out, DType::kBF16, rows, N, ref_in, N, rank * rows, 0, 1.0f,
                                        reference::tolerance(DType::kBF16, ws), s);
    RANK_CHECK(cmp.ok(), what, ": ", cmp.bad, " bad elements, max err ", cmp.max_abs_err, cmp.where());
  }
};

// `count` sets of inputs for each op (from different seeds), each with an output buffer and its reference.
struct InputSets {
  std::vector<std::unique_ptr<Buf>> ag_a, ag_out, ag_ref, rs_a, rs_out, rs_ref;
  InputSets(AgProblem& ag, RsProblem& rs, int count, int rank, reference::Fp32Gemm& fp32, cudaStream_t s) {
    for (int i = 0; i < count; ++i) {
      ag_a.push_back(std::make_unique<Buf>(ag.m * ag.K * 2));
      ag_out.push_back(std::make_unique<Buf>(ag.M * ag.N * 2));
      ag_ref.push_back(std::make_unique<Buf>(ag.M * ag.N * 4));
      ag.make(100 + i, rank, ag_a[i]->p, ag_ref[i]->f(), fp32, s);
      rs_a.push_back(std::make_unique<Buf>(rs.M * rs.kl * 2));
      rs_out.push_back(std::make_unique<Buf>(rs.rows * rs.N * 2));
      rs_ref.push_back(std::make_unique<Buf>(rs.M * rs.N * 4));
      rs.make(200 + i, rank, rs_a[i]->p, rs_ref[i]->f(), fp32, s);
    }
  }
  // all_gather_matmul on set `i` (gather_dim 0), into its output.
  void call_ag(Communicator& comm, const AgProblem& ag, int i, cudaStream_t s, const OpOptions& o) const {
    all_gather_matmul(comm, ag.a_ref(ag_a[i]->p), {ag.b_ref()}, 0, {ag.out_ref(ag_out[i]->p)}, TensorRef{}, s, o);
  }
  // matmul_reduce_scatter on set `i` (scatter_dim 0, sum), into its output.
  void call_rs(Communicator& comm, const RsProblem& rs, int i, cudaStream_t s, const OpOptions& o) const {
    matmul_reduce_scatter(comm, rs.a_ref(rs_a[i]->p), rs.b_ref(), 0, ReduceOp::kSum, rs.out_ref(rs_out[i]->p), s, o);
  }
  // Both outputs of set `i` against their references; `what` says which calls made them.
  void check(const AgProblem& ag, const RsProblem& rs, int i, int rank, int ws, const std::string& what,
             cudaStream_t s) const {
    ag.check(ag_out[i]->p, ag_ref[i]->f(), ("all_gather_matmul " + what).c_str(), s);
    rs.check(rs_out[i]->p, rs_ref[i]->f(), rank, ws, ("matmul_reduce_scatter " + what).c_str(), s);
  }
};

// A communicator and a small problem of each op, for the tests that run both.
struct BothOps {
  std::unique_ptr<Communicator> comm;
  Stream st;
  reference::Fp32Gemm fp32;
  int ws, r;
  AgProblem ag;
  RsProblem rs;
  explicit BothOps(RankContext& ctx)
      : comm(make_comm(ctx)),
        ws(ctx.world_size),
        r(ctx.rank),
        ag(ws, 256, 512, 384, st.s),
        rs(ws, r, 256 * ws, 384, 256 * ws, st.s) {}
};

// Enqueues 8 calls of each op back to back with different inputs, then checks them all. Every call
// reuses the same buffers and flags: a peer that ran ahead would overwrite what this rank has yet to read.
inline int calls_back_to_back(RankContext& ctx, const OpOptions& ag_options, const OpOptions& rs_options) {
  BothOps t(ctx);
  auto& comm = t.comm;
  auto& st = t.st;
  auto& ag = t.ag;
  auto& rs = t.rs;
  const int ws = t.ws, r = t.r;
  constexpr int kCalls = 8;
  InputSets in(ag, rs, kCalls, r, t.fp32, st.s);
  for (int i = 0; i < kCalls; ++i) {
    in.call_ag(*comm, ag, i, st.s, ag_options);
    in.call_rs(*comm, rs, i, st.s, rs_options);
  }
  for (int i = 0; i < kCalls; ++i) in.check(ag, rs, i, r, ws, detail::cat("call ", i), st.s);
  return 0;
}

// One call of each op on fixed buffers, whose A is loaded from one of two input sets before each run:
// a rank that read a peer's data too early (a stale flag) would see the other set.
struct AlternatingInputs {
  explicit AlternatingInputs(BothOps& both)
      : t(both),
        ag_a(t.ag.m * t.ag.K * 2),
        ag_out(t.ag.M * t.ag.N * 2),
        rs_a(t.rs.M * t.rs.kl * 2),
        rs_out(t.rs.rows * t.rs.N * 2),
        in(t.ag, t.rs, 2, t.r, t.fp32, t.st.s) {}

  // Both ops, enqueued on the fixed buffers.
  void step(const OpOptions& ag_options, const OpOptions& rs_options) {
    all_gather_matmul(*t.comm, t.ag.a_ref(ag_a.p), {t.ag.b_ref()}, 0, {t.ag.out_ref(ag_out.p)}, TensorRef{}, t.st.s,
                      ag_options);
    matmul_reduce_scatter(*t.comm, t.rs.a_ref(rs_a.p), t.rs.b_ref(), 0, ReduceOp::kSum, t.rs.out_ref(rs_out.p), t.st.s,
                          rs_options);
  }

  // Loads input set `v`, poisons the outputs, runs `run` (which enqueues both ops), checks both results.
  void checked(int v, const std::string& what, const std::function<void()>& run) {
    RANK_CUDA(cudaMemcpyAsync(ag_a.p, in.ag_a[v]->p, t.ag.m * t.ag.K * 2, cudaMemcpyDeviceToDevice, t.st.s));
    RANK_CUDA(cudaMemcpyAsync(rs_a.p, in.rs_a[v]->p, t.rs.M * t.rs.kl * 2, cudaMemcpyDeviceToDevice, t.st.s));
    reference::poison(ag_out.p, t.ag.M * t.ag.N * 2, t.st.s);
    reference::poison(rs_out.p, t.rs.rows * t.rs.N * 2, t.st.s);
    run();
    t.ag.check(ag_out.p, in.ag_ref[v]->f(), ("all_gather_matmul " + what).c_str(), t.st.s);
    t.rs.check(rs_out.p, in.rs_ref[v]->f(), t.r, t.ws, ("matmul_reduce_scatter " + what).c_str(), t.st.s);
  }

  BothOps& t;
  Buf ag_a, ag_out, rs_a, rs_out;
  InputSets in;
};

// Captures one call of each op in a CUDA graph and replays it `replays` times on alternating inputs.
inline int graph_replays(RankContext& ctx, const OpOptions& ag_options, const OpOptions& rs_options, int replays) {
  BothOps t(ctx);
  AlternatingInputs calls(t);
  auto step = [&] { calls.step(ag_options, rs_options); };
  step();  // outside capture: streams, flags, workspace and GEMM plans are made here
  t.comm->synchronize(t.st.s);
  cudaGraph_t graph;
  RANK_CUDA(cudaStreamBeginCapture(t.st.s, cudaStreamCaptureModeThreadLocal));
  step();
  RANK_CUDA(cudaStreamEndCapture(t.st.s, &graph));
  cudaGraphExec_t exec = executable_on_every_rank(ctx, graph, t.st.s);
  for (int i = 0; i < replays; ++i) {
    calls.checked((i * 7 / 3) % 2, detail::cat("replay ", i),  // not a plain alternation
                  [&] { RANK_CUDA(cudaGraphLaunch(exec, t.st.s)); });
  }
  std::printf("rank %d: %d replays correct\n", t.r, replays);
  RANK_CUDA(cudaGraphExecDestroy(exec));
  RANK_CUDA(cudaGraphDestroy(graph));
  return 0;
}

// The epochs that flags carry are 32-bit and compared as a signed difference, so they may wrap: every
// rank's epoch and flags are set just short of 2^32 (a test hook), then eager calls of each op cross the
// wrap, and so do replays of a graph captured before; every result is checked, on two sets of inputs
// that alternate (a stale flag would let a rank read the other set).
inline int calls_across_the_epoch_wrap(RankContext& ctx, const OpOptions& options) {
  BothOps t(ctx);
  AlternatingInputs calls(t);
  auto step = [&] { calls.step(options, options); };
  // Just short of the wrap: each call of each op advances the epoch by one.
  auto near_the_wrap = [&] {
    t.comm->synchronize(t.st.s);
    ctx.barrier();
    algo::Resources::of(*t.comm).overlap->set_epoch_for_tests(0xFFFFFFFFu - 4);
    ctx.barrier();
  };
  calls.checked(0, "first call", step);  // streams, flags, workspace and GEMM plans are made here
  cudaGraph_t graph;
  RANK_CUDA(cudaStreamBeginCapture(t.st.s, cudaStreamCaptureModeThreadLocal));
  step();
  RANK_CUDA(cudaStreamEndCapture(t.st.s, &graph));
  cudaGraphExec_t exec = executable_on_every_rank(ctx, graph, t.st.s);
  near_the_wrap();
  for (int i = 0; i < 6; ++i) calls.checked(i % 2, detail::cat("eager call across the wrap ", i), step);
  near_the_wrap();
  for (int i = 0; i < 6; ++i) {
    calls.checked(i % 2, detail::cat("replay across the wrap ", i), [&] { RANK_CUDA(cudaGraphLaunch(exec, t.st.s)); });
  }
  std::printf("rank %d: %s calls and replays across the epoch wrap correct\n", t.r, algorithm_name(options.algorithm));
  RANK_CUDA(cudaGraphExecDestroy(exec));
  RANK_CUDA(cudaGraphDestroy(graph));
  return 0;
}

// One call of each op captured at the small shapes, then, in turn, eager calls at ever larger shapes
// (each grows the communicator's scratch, workspace and fused inbox) and replays of the graph, every
// result checked. The graph holds the pointers it was captured with: had a growth freed them, a replay
// would read and write freed memory (wrong results, or a fault), the pattern of decode graphs captured
// at start and prefill run eagerly.
inline int replays_after_growth(RankContext& ctx, const OpOptions& options) {
  BothOps t(ctx);
  auto& comm = t.comm;
  auto& st = t.st;
  const int ws = t.ws, r = t.r;
  InputSets small(t.ag, t.rs, 1, r, t.fp32, st.s);
  auto step = [&] {
    small.call_ag(*comm, t.ag, 0, st.s, options);
    small.call_rs(*comm, t.rs, 0, st.s, options);
  };
  auto check_small = [&](const std::string& what) { small.check(t.ag, t.rs, 0, r, ws, what, st.s); };
  step();  // outside capture: what the small calls need is made here
  comm->synchronize(st.s);
  check_small("before capture");
  cudaGraph_t graph;
  RANK_CUDA(cudaStreamBeginCapture(st.s, cudaStreamCaptureModeThreadLocal));
  step();
  RANK_CUDA(cudaStreamEndCapture(st.s, &graph));
  cudaGraphExec_t exec = executable_on_every_rank(ctx, graph, st.s);
  for (const int64_t scale : {2, 4, 8}) {
    AgProblem ag(ws, 256 * scale, 512, 384, st.s);
    RsProblem rs(ws, r, 256 * ws * scale, 384, 256 * ws, st.s);
    InputSets big(ag, rs, 1, r, t.fp32, st.s);
    big.call_ag(*comm, ag, 0, st.s, options);
    big.call_rs(*comm, rs, 0, st.s, options);
    big.check(ag, rs, 0, r, ws, detail::cat("at ", scale, "x rows"), st.s);
    reference::poison(small.ag_out[0]->p, t.ag.M * t.ag.N * 2, st.s);
    reference::poison(small.rs_out[0]->p, t.rs.rows * t.rs.N * 2, st.s);
    RANK_CUDA(cudaGraphLaunch(exec, st.s));
    check_small(detail::cat("replayed after growing to ", scale, "x rows"));
  }
  ctx.barrier();  // every rank's replays are done before any frees what they used
  RANK_CUDA(cudaGraphExecDestroy(exec));
  RANK_CUDA(cudaGraphDestroy(graph));
  return 0;
}

// A call under capture that needs more memory than the communicator holds is refused on every rank
// with the same message (growing would allocate, and free what a replay may need); the stream is left
// capturing nothing, and the same call outside capture, then captured, runs right.
inline int growth_under_capture_is_refused(RankContext& ctx, const OpOptions& options) {
  BothOps t(ctx);
  auto& comm = t.comm;
  auto& st = t.st;
  const int ws = t.ws, r = t.r;
  InputSets small(t.ag, t.rs, 1, r, t.fp32, st.s);
  small.call_ag(*comm, t.ag, 0, st.s, options);
  small.call_rs(*comm, t.rs, 0, st.s, options);
  comm->synchronize(st.s);
  AgProblem ag(ws, 256 * 8, 512, 384, st.s);
  RsProblem rs(ws, r, 256 * ws * 8, 384, 256 * ws, st.s);
  InputSets big(ag, rs, 1, r, t.fp32, st.s);
  auto call_ag = [&] { big.call_ag(*comm, ag, 0, st.s, options); };
  auto call_rs = [&] { big.call_rs(*comm, rs, 0, st.s, options); };
  for (const auto& [what, call] : {std::pair<const char*, std::function<void()>>{"all_gather_matmul", call_ag},
                                   std::pair<const char*, std::function<void()>>{"matmul_reduce_scatter", call_rs}}) {
    RANK_CUDA(cudaStreamBeginCapture(st.s, cudaStreamCaptureModeThreadLocal));
    std::string message;
    try {
      call();
    } catch (const Error& e) {
      message = e.what();
    }
    cudaGraph_t discarded = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(st.s, &discarded);
    if (discarded != nullptr) cudaGraphDestroy(discarded);
    RANK_CHECK(ended == cudaSuccess, what, ": the capture could not be ended: ", cudaGetErrorString(ended));
    RANK_CHECK(contains(message, "under CUDA graph capture") && contains(message, "outside capture first"), what,
               ": ", message.empty() ? std::string("not refused") : message);
  }
  ctx.barrier();
  call_ag();
  call_rs();
  big.check(ag, rs, 0, r, ws, "after the refusal", st.s);
  cudaGraph_t graph;
  RANK_CUDA(cudaStreamBeginCapture(st.s, cudaStreamCaptureModeThreadLocal));
  call_ag();
  call_rs();
  RANK_CUDA(cudaStreamEndCapture(st.s, &graph));
  cudaGraphExec_t exec = executable_on_every_rank(ctx, graph, st.s);
  reference::poison(big.ag_out[0]->p, ag.M * ag.N * 2, st.s);
  reference::poison(big.rs_out[0]->p, rs.rows * rs.N * 2, st.s);
  RANK_CUDA(cudaGraphLaunch(exec, st.s));
  big.check(ag, rs, 0, r, ws, "replayed", st.s);
  ctx.barrier();
  RANK_CUDA(cudaGraphExecDestroy(exec));
  RANK_CUDA(cudaGraphDestroy(graph));
  return 0;
}

// A communicator with timeout `timeout_ms` and one small problem of either op, for the tests in which
// a peer fails or stays away. call() runs all_gather_matmul (gather_dim 0, A [ag_m, ag_kn] per rank,
// N ag_kn), or where `reduce_scatter` matmul_reduce_scatter (scatter_dim 0, rs_rows rows per rank, N
// rs_n, rs_kl of K per rank).
struct OneSmallCall {
  std::unique_ptr<Communicator> comm;
  Stream st;
  reference::Fp32Gemm fp32;
  AgProblem p;
  RsProblem q;
  Buf a, out, rs_a, rs_out;
  bool reduce_scatter;
  OneSmallCall(RankContext& ctx, int timeout_ms, bool reduce_scatter_, int64_t ag_m, int64_t ag_kn, int64_t rs_rows,
               int64_t rs_n, int64_t rs_kl)
      : comm(make_comm(ctx, timeout_ms)),
        p(ctx.world_size, ag_m, ag_kn, ag_kn, st.s),
        q(ctx.world_size, ctx.rank, rs_rows * ctx.world_size, rs_n, rs_kl * ctx.world_size, st.s),
        a(p.m * p.K * 2),
        out(p.M * p.N * 2),
        rs_a(q.M * q.kl * 2),
        rs_out(q.rows * q.N * 2),
        reduce_scatter(reduce_scatter_) {
    p.make(7, ctx.rank, a.p, p.ref.f(), fp32, st.s);
    q.make(7, ctx.rank, rs_a.p, q.ref.f(), fp32, st.s);
  }
  void call(const OpOptions& o) {
    if (reduce_scatter) {
      matmul_reduce_scatter(*comm, q.a_ref(rs_a.p), q.b_ref(), 0, ReduceOp::kSum, q.out_ref(rs_out.p), st.s, o);
    } else {
      all_gather_matmul(*comm, p.a_ref(a.p), {p.b_ref()}, 0, {p.out_ref(out.p)}, TensorRef{}, st.s, o);
    }
  }
};

// Rank 0 calls the op (all_gather_matmul, or matmul_reduce_scatter where `reduce_scatter`) a second
// time and no other rank does: rank 0's wait must end with the timeout report (1.5 s) naming rank 1,
// and nothing may hang.
inline int absent_peer_times_out(RankContext& ctx, const OpOptions& options, bool reduce_scatter = false) {
  OneSmallCall f(ctx, /*timeout_ms=*/1500, reduce_scatter, 128, 256, 256, 256, 256);
  f.call(options);
  f.comm->synchronize(f.st.s);  // both ranks made the first call together
  if (ctx.rank == 0) {
    OpOptions o = options;
    o.check_across_ranks = false;  // the host check would name the absent rank first; test the GPU's wait
    const auto t0 = std::chrono::steady_clock::now();
    f.call(o);
    std::string message;
    try {
      f.comm->synchronize(f.st.s);
    } catch (const Error& e) {
      message = e.what();
    }
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("after %.2f s: %s\n", took, message.c_str());
    RANK_CHECK(contains(message, "timed out after"), message);
    bool names_a_peer = false;  // every peer is absent; the report names the first flag it found unset
    for (int q = 1; q < ctx.world_size; ++q) names_a_peer |= contains(message, detail::cat("of rank ", q, " "));
    RANK_CHECK(names_a_peer, message);
    RANK_CHECK(took >= 1.4 && took < 10.0, "took ", took, " s");
  }
  // A bound of the test's own, not ASYNCTP_TIMEOUT_MS: rank 0's trapped call may take up to 10 s.
  ctx.barrier(/*timeout_ms=*/30000);
  if (ctx.rank != 0) (void)f.comm.release();  // rank 0's context is gone: no collective teardown
  return 0;
}

// A call that throws on rank 0 after its epoch began (a test hook fails it there) leaves the peers
// waiting on flags rank 0 will not raise: rank 0's communicator is then broken, its error saying why,
// and its next call is refused quoting the cause; the peers' calls end with the timeout report (or,
// in-process, with the group's abort).
inline int failure_mid_protocol_breaks_the_communicator(RankContext& ctx, const OpOptions& options,
                                                        bool reduce_scatter = false) {
  OneSmallCall f(ctx, /*timeout_ms=*/1500, reduce_scatter, 128, 256, 256, 256, 256);
  f.call(options);
  f.comm->synchronize(f.st.s);  // the overlapped resources exist, and both ranks made a call together
  ctx.barrier();
  // The error `fn` throws, or "" where it throws none.
  auto error_of = [](const std::function<void()>& fn) {
    try {
      fn();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const char* injected = "a failure the test injects after the epoch began";
  if (ctx.rank == 0) {
    algo::Resources::of(*f.comm).overlap->fail_after_next_epoch(injected);
    const std::string first = error_of([&] { f.call(options); });
    RANK_CHECK(contains(first, injected) && contains(first, "can no longer be used"), "first call: ", first);
    const std::string next = error_of([&] { f.call(options); });
    RANK_CHECK(contains(next, "can no longer be used, since") && contains(next, injected), "next call: ", next);
  } else {
    const std::string message = error_of([&] {
      f.call(options);
      f.comm->synchronize(f.st.s);
    });
    RANK_CHECK(contains(message, "timed out after") || contains(message, "aborted"), message);
  }
  (void)f.comm.release();  // a peer's kernel trapped, or its group was aborted: no collective teardown
  return 0;
}

}  // namespace asynctp::testing
