// asynctp-soak's random calls: every one legal for the ops at world sizes 1 to 8, the same sequence
// for the same seed, and the variety the soak is meant to cover.
#include <gtest/gtest.h>

#include <set>

#include "asynctp/error.h"
#include "ops/plan.h"
#include "soak/calls.h"

namespace asynctp::soak {
namespace {

void* at(int i) { return reinterpret_cast<void*>(static_cast<uintptr_t>(i + 1) << 32); }  // 4 GiB apart

TEST(SoakCalls, EveryDrawnCallIsLegalAndWithinTheBounds) {
  for (const int ws : {1, 2, 4, 8}) {
    std::mt19937_64 rng(7);
    int two_bs = 0, returned = 0, last = 0, col = 0, fp16 = 0, fused_rs_rows = 0, avg = 0;
    for (int i = 0; i < 20000; ++i) {
      const bool ag = i % 2 == 0;
      const Call c = draw_call(rng, ag, ws, 2048);
      SCOPED_TRACE(describe(c));
      void* const bs[2] = {at(1), at(2)};
      void* const outs[2] = {at(3), at(4)};
      const Tensors t = tensors_of(c, ws - 1, ws, at(0), bs, outs, at(5));
      OpOptions o;
      o.b_layout = c.b_layout;
      if (ag) {
        EXPECT_NO_THROW(ops::plan_all_gather_matmul(ws, t.a, t.bs, t.dim, t.outs, t.gathered, o));
      } else {
        EXPECT_NO_THROW(ops::plan_matmul_reduce_scatter(ws, t.a, t.bs[0], t.dim, c.reduce, t.outs[0], o));
        fused_rs_rows += !c.last_dim && (c.M / ws) % 256 == 0;
        avg += c.reduce == ReduceOp::kAvg;
      }
      for (const TensorRef* x : {&t.a, &t.bs[0], &t.outs[0]}) EXPECT_LE(x->numel(), max_elements(2048));
      EXPECT_LE(c.M, 2048);
      EXPECT_LE(c.K, 2048);
      two_bs += c.num_b == 2, returned += c.return_a, last += c.last_dim;
      col += c.b_layout == BLayout::kColMajor, fp16 += c.dtype == DType::kFP16;
    }
    for (const int n : {two_bs, returned, last, col, fp16, fused_rs_rows, avg}) EXPECT_GT(n, 1000) << "world " << ws;
  }
}

TEST(SoakCalls, TheSameSeedDrawsTheSameSequence) {
  std::mt19937_64 x(3), y(3), z(4);
  std::set<std::string> distinct;
  bool differs = false;
  for (int i = 0; i < 1000; ++i) {
    const std::string a = describe(draw_call(x, i % 3 != 0, 2, 1024));
    EXPECT_EQ(a, describe(draw_call(y, i % 3 != 0, 2, 1024)));
    differs |= a != describe(draw_call(z, i % 3 != 0, 2, 1024));
    distinct.insert(a);
  }
  EXPECT_TRUE(differs);
  EXPECT_GT(distinct.size(), 900u);
}

TEST(SoakCalls, ABadMaxDimIsRefusedByName) {
  std::mt19937_64 rng(1);
  try {
    draw_call(rng, true, 8, 1000);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--max-dim 1000 must be a multiple of 8 x world size (64)"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace asynctp::soak
