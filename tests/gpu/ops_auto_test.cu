// Algorithm::kAuto: whatever it picks gives the reference's answer; a tuning cache's entries are
// followed (algorithm and chunks); ranks whose caches disagree fail together instead of running
// different protocols; a cache file that cannot be read or parsed is an error naming it.
#include <chrono>
#include <cstdio>

#include "comm/communicator_impl.h"
#include "ops_problems.h"
#include "tune/resolve.h"
#include "tuning_cache_file.h"

namespace asynctp {
namespace {

using namespace testing;

OpOptions auto_options() {
  OpOptions o;
  o.algorithm = Algorithm::kAuto;
  return o;
}

int every_combination(RankContext& ctx) {
  auto comm = make_comm(ctx);
  Stream st;
  reference::Fp32Gemm fp32;
  const int ws = ctx.world_size;
  int n = run_every_ag_combination(*comm, st.s, fp32, auto_options());
  for (bool last : {false, true})
    for (DType dt : {DType::kBF16, DType::kFP16}) {
      run_rs_case(*comm, RsCase{256 * ws, 384, 512 * ws, last, false, ReduceOp::kSum, dt, false}, st.s, fp32, auto_options());
      ++n;
    }
  std::printf("rank %d: auto: %d cases correct\n", ctx.rank, n);
  return 0;
}

TEST(AutoOps, EveryCombination_1Rank) {
  REQUIRE_GPUS(1);
  RUN_RANKS(1, every_combination);
}

TEST(AutoOps, EveryCombination_MultiRank) {
  RUN_EVERY_WORLD_SIZE(every_combination);
}

// Entries for two small shapes say pipelined with 2 chunks (all_gather_matmul) and fused with 2
// chunks (matmul_reduce_scatter), which the model alone would not pick for shapes this small.
TEST(AutoOps, CacheEntriesAreFollowed_MultiRank) {
  RUN_EVERY_WORLD_SIZE([](RankContext& ctx) {
    const int ws = ctx.world_size;
    const int64_t ag_m = 256 * ws, rs_m = 512 * ws, N = 384, K = 512;
    const std::string path = write_cache(ctx, {"{\"kind\":\"note\",\"text\":\"test\"}",
                                               choice_line(ctx, "ag", ag_m, N, K, "pipelined", 2),
                                               choice_line(ctx, "rs", rs_m, N, K * ws, "fused", 2)});
    auto comm = comm_with_cache(ctx, path);
    tune::ProblemKey key;
    key.op = tune::Op::kAllGatherMatmul, key.M = ag_m, key.N = N, key.K = K;
    key.world_size = ws, key.gpu = impl_of(*comm).gpu_name;
    tune::Choice c = tune::choose_for(*comm, key);
    RANK_CHECK(c.from_cache && c.algorithm == Algorithm::kPipelined && c.chunks_per_rank == 2, "ag: ", c.why);
    key.op = tune::Op::kMatmulReduceScatter, key.M = rs_m, key.K = K * ws;
    c = tune::choose_for(*comm, key);
    RANK_CHECK(c.from_cache && c.algorithm == Algorithm::kFused && c.chunks_per_rank == 2, "rs: ", c.why);
    key.M = rs_m + 2 * ws;  // no entry: the model's choice
    RANK_CHECK(!tune::choose_for(*comm, key).from_cache, "a shape without an entry came from the cache");
    Stream st;
    reference::Fp32Gemm fp32;
    run_ag_case(*comm, AgCase{{ag_m, K}, N, false, false, false, 1, DType::kBF16}, st.s, fp32, auto_options());
    run_rs_case(*comm, RsCase{rs_m, N, K * ws, false, false, ReduceOp::kSum, DType::kBF16, false}, st.s, fp32, auto_options());
    std::remove(path.c_str());
    return 0;
  });
}

// Rank 0's cache says fused for the shape, the others have none (the model picks sequential for a
// shape this small): the cross-rank check sees different algorithms and every rank gets the error.
TEST(AutoOps, RanksWhoseCachesDisagreeFailTogether) {
  REQUIRE_GPUS(2);
  RUN_RANKS(2, [](RankContext& ctx) {
    const int64_t M = 256 * ctx.world_size, N = 384, K = 512;
    const std::string path = ctx.rank == 0 ? write_cache(ctx, {choice_line(ctx, "ag", M, N, K, "fused", 1)}) : "";
    auto comm = comm_with_cache(ctx, path);
    Stream st;
    Buf a(M / ctx.world_size * K * 2), b(K * N * 2), out(M * N * 2);
    const TensorRef ta = TensorRef::dense(a.p, DType::kBF16, {M / ctx.world_size, K});
    const TensorRef tb = TensorRef::dense(b.p, DType::kBF16, {K, N});
    const TensorRef to = TensorRef::dense(out.p, DType::kBF16, {M, N});
    try {
      all_gather_matmul(*comm, ta, {tb}, 0, {to}, TensorRef{}, st.s, auto_options());
      RANK_CHECK(false, "ranks with different choices ran the op");
    } catch (const Error& e) {
      // fused's signature has one more field than sequential's, so the check reports that first.
      RANK_CHECK(contains(e.what(), "all_gather_matmul: ranks disagree on"), e.what());
    }
    if (!path.empty()) std::remove(path.c_str());
    return 0;
  });
}

// Only rank 1's cache cannot be parsed: its call fails naming the file and line, and every other rank's
// at once with "rank 1 refused its arguments" (not after waiting out the timeout for it).
TEST(AutoOps, ACacheThatCannotBeParsedOnOneRankFailsEveryRankAtOnce) {
  RUN_EVERY_WORLD_SIZE([](RankContext& ctx) {
    const std::string bad =
        ctx.rank == 1 ? write_cache(ctx, {"{\"kind\":\"note\"}", "{\"kind\":\"choice\",\"op\":\"ag\",\"M\":[1]}"})
                      : std::string();
    auto comm = comm_with_cache(ctx, bad);
    Stream st;
    const int64_t m = 256, K = 512, N = 384, M = m * ctx.world_size;
    Buf a(m * K * 2), b(K * N * 2), out(M * N * 2);
    const auto start = std::chrono::steady_clock::now();
    std::string message;
    try {
      all_gather_matmul(*comm, TensorRef::dense(a.p, DType::kBF16, {m, K}), {TensorRef::dense(b.p, DType::kBF16, {K, N})},
                        0, {TensorRef::dense(out.p, DType::kBF16, {M, N})}, TensorRef{}, st.s, auto_options());
    } catch (const Error& e) {
      message = e.what();
    }
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (ctx.rank == 1) {
      RANK_CHECK(contains(message, bad + ", line 2: not a flat JSON object"), message);
      std::remove(bad.c_str());
    } else {
      RANK_CHECK(contains(message, "all_gather_matmul: rank 1 refused its arguments"), message);
    }
    RANK_CHECK(took < comm->timeout_ms() / 2000.0, "the call took ", took, " s to fail");
    return 0;
  });
}

// (A missing file and each kind of bad line are CPU-tested in tests/unit/tune_test.cc.)
TEST(AutoOps, ACacheThatCannotBeParsedIsAnErrorNamingIt) {
  REQUIRE_GPUS(1);
  RUN_RANKS(1, [](RankContext& ctx) {
    const std::string bad = write_cache(ctx, {"{\"kind\":\"note\"}", "{\"kind\":\"choice\",\"op\":\"ag\",\"M\":[1]}"});
    auto comm = comm_with_cache(ctx, bad);
    Stream st;
    Buf a(256 * 512 * 2), b(512 * 384 * 2), out(256 * 384 * 2);
    const TensorRef ta = TensorRef::dense(a.p, DType::kBF16, {256, 512});
    const TensorRef tb = TensorRef::dense(b.p, DType::kBF16, {512, 384});
    const TensorRef to = TensorRef::dense(out.p, DType::kBF16, {256, 384});
    try {
      all_gather_matmul(*comm, ta, {tb}, 0, {to}, TensorRef{}, st.s, auto_options());
      RANK_CHECK(false, "no error");
    } catch (const Error& e) {
      const std::string m = e.what();
      RANK_CHECK(contains(m, bad + ", line 2: not a flat JSON object"), m);
    }
    std::remove(bad.c_str());
    return 0;
  });
}

}  // namespace
}  // namespace asynctp
