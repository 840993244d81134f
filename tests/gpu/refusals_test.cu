// A call refused on one rank before its op runs (by a binding's own checks, or for too many arguments
// to compare) reaches the other ranks at once through the agreement across ranks: they fail with
// "rank 0 refused its arguments" well inside the communicators' 30 s timeout, not after it.
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "asynctp/c_api.h"
#include "c_comm.h"
#include "comm/communicator_impl.h"
#include "ops/refuse.h"
#include "ops_problems.h"

namespace asynctp {
namespace {

using namespace asynctp::testing;
using Clock = std::chrono::steady_clock;

constexpr int kTimeoutMs = 30000;  // a peer left waiting would take this long
constexpr double kAtOnce = 5.0;    // seconds: what "at once" allows (slow first calls included)

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Runs `call`, returns its error message ("" if none) and checks it came within kAtOnce.
template <typename F>
std::string refused_at_once(RankContext& ctx, const char* what, F call) {
  const auto t0 = Clock::now();
  std::string message;
  try {
    call();
  } catch (const Error& e) {
    message = e.what();
  }
  const double took = seconds_since(t0);
  std::printf("rank %d, %s: after %.2f s: %s\n", ctx.rank, what, took, message.c_str());
  RANK_CHECK(took < kAtOnce, what, ": took ", took, " s");
  return message;
}

// Rank 0 refuses through ops::refuse_call (what the C API and the Python package use); the others
// make the real call, with every algorithm.
int refusal_reaches_the_peers(RankContext& ctx) {
  auto comm = make_comm(ctx, kTimeoutMs);
  Stream st;
  reference::Fp32Gemm fp32;
  AgProblem p(ctx.world_size, 128, 256, 256, st.s);
  RsProblem q(ctx.world_size, ctx.rank, 256 * ctx.world_size, 256, 256 * ctx.world_size, st.s);
  Buf a(p.m * p.K * 2), out(p.M * p.N * 2), rs_a(q.M * q.kl * 2), rs_out(q.rows * q.N * 2);
  p.make(3, ctx.rank, a.p, p.ref.f(), fp32, st.s);
  q.make(3, ctx.rank, rs_a.p, q.ref.f(), fp32, st.s);
  for (const Algorithm algorithm : {Algorithm::kSequential, Algorithm::kPipelined, Algorithm::kFused}) {
    OpOptions o;
    o.algorithm = algorithm;
    for (const bool rs : {false, true}) {
      const char* op = rs ? "matmul_reduce_scatter" : "all_gather_matmul";
      const std::string what = detail::cat(op, " (", algorithm_name(algorithm), ")");
      const std::string message = refused_at_once(ctx, what.c_str(), [&] {
        if (ctx.rank == 0) {
          ops::refuse_call(*comm, op, "the binding says no", st.s, true);
        } else if (rs) {
          matmul_reduce_scatter(*comm, q.a_ref(rs_a.p), q.b_ref(), 0, ReduceOp::kSum, q.out_ref(rs_out.p), st.s, o);
        } else {
          all_gather_matmul(*comm, p.a_ref(a.p), {p.b_ref()}, 0, {p.out_ref(out.p)}, TensorRef{}, st.s, o);
        }
        comm->synchronize(st.s);
      });
      if (ctx.rank == 0) {
        RANK_CHECK(message == "the binding says no", what, ": ", message);
      } else {
        RANK_CHECK(contains(message, "rank 0 refused its arguments"), what, ": ", message);
      }
    }
  }
  // The communicator is still good on every rank: the next call runs and is right.
  all_gather_matmul(*comm, p.a_ref(a.p), {p.b_ref()}, 0, {p.out_ref(out.p)}, TensorRef{}, st.s);
  p.check(out.p, p.ref.f(), "after the refusals", st.s);
  return 0;
}

TEST(Refusals, ABindingsRefusalReachesThePeersAtOnce) { RUN_EVERY_WORLD_SIZE(refusal_reaches_the_peers); }

// Rank 0 passes more B than the agreement can compare; the others pass one.
int too_many_arguments_reach_the_peers(RankContext& ctx) {
  auto comm = make_comm(ctx, kTimeoutMs);
  Stream st;
  reference::Fp32Gemm fp32;
  AgProblem p(ctx.world_size, 128, 256, 256, st.s);
  Buf a(p.m * p.K * 2);
  p.make(5, ctx.rank, a.p, p.ref.f(), fp32, st.s);
  const int count = ctx.rank == 0 ? kCheckSlots / 2 : 1;  // 2 values a B: more than the agreement holds
  std::vector<std::unique_ptr<Buf>> outs;
  std::vector<TensorRef> bs, out_refs;
  for (int i = 0; i < count; ++i) {
    outs.push_back(std::make_unique<Buf>(p.M * p.N * 2));
    bs.push_back(p.b_ref());
    out_refs.push_back(p.out_ref(outs.back()->p));
  }
  const std::string message = refused_at_once(ctx, "too many B on rank 0", [&] {
    all_gather_matmul(*comm, p.a_ref(a.p), bs, 0, out_refs, TensorRef{}, st.s);
    comm->synchronize(st.s);
  });
  RANK_CHECK(contains(message, ctx.rank == 0 ? "too many arguments to compare across ranks" : "rank 0 refused"),
             message);
  return 0;
}

TEST(Refusals, TooManyArgumentsOnOneRankReachThePeersAtOnce) {
  RUN_EVERY_WORLD_SIZE(too_many_arguments_reach_the_peers);
}

asynctp_tensor c_tensor(const TensorRef& t) {
  asynctp_tensor c{};
  c.data = t.data;
  c.dtype = 0;  // ASYNCTP_BF16
  c.ndim = t.ndim;
  for (int d = 0; d < t.ndim; ++d) {
    c.shape[d] = t.shape[d];
    c.strides[d] = t.strides[d];
  }
  return c;
}

// Rank 0's C call is refused by the C API itself (a reduce_op it does not know); the others' C calls
// are fine and must fail at once naming rank 0.
int c_api_refusal_reaches_the_peers(RankContext& ctx) {
  CComm c(ctx, kTimeoutMs);
  Stream st;
  reference::Fp32Gemm fp32;
  RsProblem q(ctx.world_size, ctx.rank, 256 * ctx.world_size, 256, 256 * ctx.world_size, st.s);
  Buf rs_a(q.M * q.kl * 2), rs_out(q.rows * q.N * 2);
  q.make(7, ctx.rank, rs_a.p, q.ref.f(), fp32, st.s);
  const asynctp_tensor a = c_tensor(q.a_ref(rs_a.p)), b = c_tensor(q.b_ref()), out = c_tensor(q.out_ref(rs_out.p));
  asynctp_op_options o;
  asynctp_op_options_default(&o);
  const auto t0 = Clock::now();
  int rc = asynctp_matmul_reduce_scatter(c.comm, &a, &b, 0, ctx.rank == 0 ? 7 : ASYNCTP_SUM, &out, st.s, &o);
  if (rc == 0) rc = asynctp_comm_synchronize(c.comm, st.s);
  const double took = seconds_since(t0);
  const std::string message = rc == 0 ? std::string() : asynctp_last_error();
  std::printf("rank %d, C API: after %.2f s: %s\n", ctx.rank, took, message.c_str());
  RANK_CHECK(rc != 0 && took < kAtOnce, "rc ", rc, " after ", took, " s");
  RANK_CHECK(contains(message, ctx.rank == 0 ? "reduce_op is 7" : "rank 0 refused its arguments"), message);
  // And the communicators still work: a good call runs on every rank and is right.
  RANK_CHECK(asynctp_matmul_reduce_scatter(c.comm, &a, &b, 0, ASYNCTP_SUM, &out, st.s, &o) == 0, asynctp_last_error());
  RANK_CHECK(asynctp_comm_synchronize(c.comm, st.s) == 0, asynctp_last_error());
  q.check(rs_out.p, q.ref.f(), ctx.rank, ctx.world_size, "after the refusal", st.s);
  return 0;
}

TEST(Refusals, TheCApisOwnRefusalReachesThePeersAtOnce) { RUN_EVERY_WORLD_SIZE(c_api_refusal_reaches_the_peers); }

}  // namespace
}  // namespace asynctp
