// Inputs at the edges: the opt-in NaN/Inf scan (ASYNCTP_CHECK_NAN=1) and tensors of more than 2^31
// elements, on every algorithm. (Arguments refused by name: tests/unit/ops_plan_test.cc and
// ops_test.cu; world size 1: the *_1Rank tests.)
#include <cuda_bf16.h>

#include <cstdlib>
#include <limits>

#include "ops_problems.h"

namespace asynctp {
namespace {

using namespace asynctp::testing;

const Algorithm kAlgorithms[] = {Algorithm::kSequential, Algorithm::kPipelined, Algorithm::kFused};

void put_bf16(void* base, int64_t index, float value, cudaStream_t s) {
  const __nv_bfloat16 v = __float2bfloat16(value);
  RANK_CUDA(cudaMemcpyAsync(static_cast<__nv_bfloat16*>(base) + index, &v, sizeof v, cudaMemcpyHostToDevice, s));
  RANK_CUDA(cudaStreamSynchronize(s));
}

// Rank 1 plants a non-finite value in one input; every rank's call must fail (rank 1 naming itself,
// the tensor, the value and its index; the others naming rank 1), with the outputs untouched. With
// clean inputs the same calls run and are right.
int nonfinite_inputs_are_named(RankContext& ctx) {
  ::setenv("ASYNCTP_CHECK_NAN", "1", 1);  // this rank's process only
  auto comm = make_comm(ctx);
  Stream st;
  reference::Fp32Gemm fp32;
  AgProblem p(ctx.world_size, 128, 256, 256, st.s);
  RsProblem q(ctx.world_size, ctx.rank, 256 * ctx.world_size, 256, 256 * ctx.world_size, st.s);
  Buf a(p.m * p.K * 2), out(p.M * p.N * 2), rs_a(q.M * q.kl * 2), rs_out(q.rows * q.N * 2);
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (const Algorithm algorithm : kAlgorithms) {
    OpOptions o;
    o.algorithm = algorithm;
    struct Plant {
      bool reduce_scatter;
      const char* tensor;
      int64_t row, col;
      float value;
      const char* expect;  // on rank 1
    };
    for (const Plant& plant : {Plant{false, "bs[0]", 3, 5, inf, "the first is inf at bs[0][3, 5]"},
                               Plant{false, "a_shard", 100, 7, nan, "the first is nan at a_shard[100, 7]"},
                               Plant{true, "a", 9, 200, -inf, "the first is -inf at a[9, 200]"}}) {
      reference::fill(p.b.p, DType::kBF16, p.K, p.N, false, GenMatrix{5, 0, 0}, 0, 0, st.s);  // as AgProblem made it
      p.make(11, ctx.rank, a.p, p.ref.f(), fp32, st.s);
      q.make(11, ctx.rank, rs_a.p, q.ref.f(), fp32, st.s);
      void* target = plant.reduce_scatter ? rs_a.p : std::string(plant.tensor) == "bs[0]" ? p.b.p : a.p;
      const int64_t cols = plant.reduce_scatter ? q.kl : std::string(plant.tensor) == "bs[0]" ? p.N : p.K;
      if (ctx.rank == 1) put_bf16(target, plant.row * cols + plant.col, plant.value, st.s);
      RANK_CUDA(cudaMemsetAsync(out.p, 0x5A, p.M * p.N * 2, st.s));
      RANK_CUDA(cudaMemsetAsync(rs_out.p, 0x5A, q.rows * q.N * 2, st.s));
      std::string message;
      try {
        if (plant.reduce_scatter) {
          matmul_reduce_scatter(*comm, q.a_ref(rs_a.p), q.b_ref(), 0, ReduceOp::kSum, q.out_ref(rs_out.p), st.s, o);
        } else {
          all_gather_matmul(*comm, p.a_ref(a.p), {p.b_ref()}, 0, {p.out_ref(out.p)}, TensorRef{}, st.s, o);
        }
        comm->synchronize(st.s);
      } catch (const Error& e) {
        message = e.what();
      }
      std::printf("rank %d, %s: %s\n", ctx.rank, algorithm_name(algorithm), message.c_str());
      if (ctx.rank == 1) {
        RANK_CHECK(contains(message, detail::cat("ASYNCTP_CHECK_NAN: ", plant.tensor, " on rank 1 holds 1 non-finite "
                                                 "value(s)")) && contains(message, plant.expect),
                   message);
      } else {
        RANK_CHECK(contains(message, "rank 1 refused its arguments"), message);
      }
      std::vector<unsigned char> host((plant.reduce_scatter ? q.rows * q.N : p.M * p.N) * 2);
      RANK_CUDA(cudaMemcpyAsync(host.data(), plant.reduce_scatter ? rs_out.p : out.p, host.size(),
                                cudaMemcpyDeviceToHost, st.s));
      RANK_CUDA(cudaStreamSynchronize(st.s));
      for (unsigned char v : host) RANK_CHECK(v == 0x5A, "an output was written to although the call was refused");
    }
    // Clean inputs: the scan passes them and the results are right.
    p.make(13, ctx.rank, a.p, p.ref.f(), fp32, st.s);
    RsProblem clean(ctx.world_size, ctx.rank, 256 * ctx.world_size, 256, 256 * ctx.world_size, st.s);
    clean.make(13, ctx.rank, rs_a.p, clean.ref.f(), fp32, st.s);
    all_gather_matmul(*comm, p.a_ref(a.p), {p.b_ref()}, 0, {p.out_ref(out.p)}, TensorRef{}, st.s, o);
    matmul_reduce_scatter(*comm, clean.a_ref(rs_a.p), clean.b_ref(), 0, ReduceOp::kSum, clean.out_ref(rs_out.p), st.s, o);
    p.check(out.p, p.ref.f(), "all_gather_matmul with the scan on", st.s);
    clean.check(rs_out.p, clean.ref.f(), ctx.rank, ctx.world_size, "matmul_reduce_scatter with the scan on", st.s);
  }
  return 0;
}

TEST(Inputs, NonFiniteInputsAreNamedWithRankTensorAndIndexUnderCheckNan) {
  RUN_EVERY_WORLD_SIZE(nonfinite_inputs_are_named);
}

// What the refusal tests below share: a small problem of each op on every rank, whose outputs are
// poisoned before each call; rank 1 passes a tensor it should not, and every rank checks the errors and
// that no output was written.
struct RankOneRefuses {
  explicit RankOneRefuses(RankContext& ctx)
      : comm(make_comm(ctx)),
        p(ctx.world_size, 128, 256, 256, st.s),
        q(ctx.world_size, ctx.rank, 256 * ctx.world_size, 256, 256 * ctx.world_size, st.s),
        mine(ctx.rank == 1) {}

  // Calls both ops with `o` and the tensors given (the problem's own where not), each error kept.
  void call(const OpOptions& o, const TensorRef& ag_b, const TensorRef& ag_out, const TensorRef& rs_a,
            const TensorRef& rs_out) {
    RANK_CUDA(cudaMemsetAsync(out.p, 0x5A, p.M * p.N * 2, st.s));
    RANK_CUDA(cudaMemsetAsync(rs_out_buf.p, 0x5A, q.rows * q.N * 2, st.s));
    RANK_CUDA(cudaStreamSynchronize(st.s));
    ag_error.clear(), rs_error.clear();
    try {
      all_gather_matmul(*comm, p.a_ref(a.p), {ag_b}, 0, {ag_out}, TensorRef{}, st.s, o);
    } catch (const Error& e) {
      ag_error = e.what();
    }
    try {
      matmul_reduce_scatter(*comm, rs_a, q.b_ref(), 0, ReduceOp::kSum, rs_out, st.s, o);
    } catch (const Error& e) {
      rs_error = e.what();
    }
  }

  // Rank 1's errors hold `ag_mine` and `rs_mine`, every other rank's name rank 1; no output was written.
  void check(const std::string& ag_mine, const std::string& rs_mine, const std::string& what) {
    const std::string ag = mine ? ag_mine : "all_gather_matmul: rank 1 refused its arguments";
    const std::string rs = mine ? rs_mine : "matmul_reduce_scatter: rank 1 refused its arguments";
    RANK_CHECK(contains(ag_error, ag), what, ": ", ag_error);
    RANK_CHECK(contains(rs_error, rs), what, ": ", rs_error);
    std::vector<unsigned char> ag_host(p.M * p.N * 2), rs_host(q.rows * q.N * 2);
    RANK_CUDA(cudaMemcpyAsync(ag_host.data(), out.p, ag_host.size(), cudaMemcpyDeviceToHost, st.s));
    RANK_CUDA(cudaMemcpyAsync(rs_host.data(), rs_out_buf.p, rs_host.size(), cudaMemcpyDeviceToHost, st.s));
    comm->synchronize(st.s);
    for (unsigned char v : ag_host) RANK_CHECK(v == 0x5A, what, ": all_gather_matmul's output was written to");
    for (unsigned char v : rs_host) RANK_CHECK(v == 0x5A, what, ": matmul_reduce_scatter's output was written to");
  }

  std::unique_ptr<Communicator> comm;
  Stream st;
  AgProblem p;
  RsProblem q;
  bool mine;
  Buf a{bytes(p.m * p.K)}, out{bytes(p.M * p.N)}, rs_a_buf{bytes(q.M * q.kl)}, rs_out_buf{bytes(q.rows * q.N)};
  static size_t bytes(int64_t bf16_elements) { return static_cast<size_t>(bf16_elements) * 2; }
  std::string ag_error, rs_error;
};

// Rank 1 passes one tensor from host memory (pinned, then unregistered): with every algorithm and both
// ops, its call names the tensor and the memory, every other rank's names rank 1, and no rank's output
// is written.
int tensors_off_the_gpu_are_refused(RankContext& ctx) {
  RankOneRefuses t(ctx);
  const auto& p = t.p;
  const auto& q = t.q;
  void* pinned = nullptr;
  RANK_CUDA(cudaMallocHost(&pinned, std::max(p.K * p.N, q.rows * q.N) * 2));
  std::vector<char> unregistered(static_cast<size_t>(std::max(p.K * p.N, q.rows * q.N) * 2) + 16);
  void* plain = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(unregistered.data()) + 15) / 16 * 16);
  for (const Algorithm algorithm : {Algorithm::kSequential, Algorithm::kPipelined, Algorithm::kFused}) {
    for (void* host : {pinned, plain}) {
      const char* kind = host == pinned ? "pinned host memory" : "host memory";
      OpOptions o;
      o.algorithm = algorithm;
      t.call(o, t.mine ? TensorRef::dense(host, DType::kBF16, {p.K, p.N}) : p.b_ref(), p.out_ref(t.out.p),
             q.a_ref(t.rs_a_buf.p), t.mine ? TensorRef::dense(host, DType::kBF16, {q.rows, q.N}) : q.out_ref(t.rs_out_buf.p));
      t.check(detail::cat("all_gather_matmul: bs[0] is ", kind, "; expected device memory"),
              detail::cat("matmul_reduce_scatter: output is ", kind, "; expected device memory"),
              detail::cat(algorithm_name(algorithm), ", ", kind));
    }
  }
  RANK_CUDA(cudaFreeHost(pinned));
  std::printf("rank %d: host tensors refused with every algorithm\n", ctx.rank);
  return 0;
}

TEST(Inputs, TensorsOffTheGpuAreRefusedByNameOnEveryRank) {
  RUN_EVERY_WORLD_SIZE(tensors_off_the_gpu_are_refused);
}

// Rank 1 puts all_gather_matmul's output, then matmul_reduce_scatter's A, in the communicator's own
// workspace: with every algorithm its call names the tensor and the workspace, every other rank's names
// rank 1, and no rank's output is written.
int tensors_in_the_workspace_are_refused(RankContext& ctx) {
  RankOneRefuses t(ctx);
  const auto& p = t.p;
  const auto& q = t.q;
  char* workspace = static_cast<char*>(t.comm->workspace(std::max(p.M * p.N, q.M * q.kl) * 2 + 4096).local());
  for (const Algorithm algorithm : kAlgorithms) {
    OpOptions o;
    o.algorithm = algorithm;
    t.call(o, p.b_ref(), p.out_ref(t.mine ? workspace + 4096 : t.out.p), q.a_ref(t.mine ? workspace : t.rs_a_buf.p),
           q.out_ref(t.rs_out_buf.p));
    t.check("all_gather_matmul: outputs[0] lies in this communicator's workspace",
            "matmul_reduce_scatter: a lies in this communicator's workspace", algorithm_name(algorithm));
  }
  std::printf("rank %d: tensors in the workspace refused with every algorithm\n", ctx.rank);
  return 0;
}

TEST(Inputs, TensorsInTheCommunicatorsWorkspaceAreRefusedByNameOnEveryRank) {
  RUN_EVERY_WORLD_SIZE(tensors_in_the_workspace_are_refused);
}

// C has 32768 x 65664 = 2,151,677,952 elements (more than 2^31) and the reduce-scatter's partial
// product as many: every offset past 2^31 must be computed in 64 bits, by every algorithm.
TEST(Inputs, TensorsOfMoreThan2Pow31ElementsAreRight) {
  REQUIRE_GPUS(2);
  RUN_RANKS(2, [](RankContext& ctx) {
    auto comm = make_comm(ctx);
    Stream st;
    reference::Fp32Gemm fp32;
    const int ws = ctx.world_size;
    for (const Algorithm algorithm : kAlgorithms) {
      OpOptions o;
      o.algorithm = algorithm;
      run_ag_case(*comm, AgCase{{32768, 64}, 65664, false, false, false, 1, DType::kBF16}, st.s, fp32, o);
      run_rs_case(*comm, RsCase{32768, 65664, 64 * ws, false, false, ReduceOp::kSum, DType::kBF16, false}, st.s, fp32, o);
      comm->synchronize(st.s);
      std::printf("rank %d: %s right past 2^31 elements\n", ctx.rank, algorithm_name(algorithm));
    }
    return 0;
  });
}

}  // namespace
}  // namespace asynctp
