// auto's chunks that need no GPU: the cache's JSON Lines, its lookups and errors, the model's rules,
// the fit of its rates, and the cache built into the library.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>

#include "asynctp/error.h"
#include "tune/choice.h"
#include "tune/fit.h"
#include "tune/flat_json.h"
#include "tune/resolve.h"

namespace asynctp::tune {
namespace {

ProblemKey key(Op op, int64_t M, int64_t N, int64_t K, int ws = 2) {
  ProblemKey k;
  k.op = op, k.M = M, k.N = N, k.K = K, k.world_size = ws, k.gpu = "NVIDIA H200";
  return k;
}

std::string choice(const char* op, int64_t M, const char* algorithm, int chunks, int ws = 2) {
  return std::string("{\"kind\":\"choice\",\"gpu\":\"NVIDIA H200\",\"world_size\":") + std::to_string(ws) +
         ",\"op\":\"" + op + "\",\"dtype\":\"bf16\",\"dim\":\"0\",\"M\":" + std::to_string(M) +
         ",\"N\":3584,\"K\":8192,\"algorithm\":\"" + algorithm + "\",\"chunks_per_rank\":" + std::to_string(chunks) +
         ",\"us\":100.5,\"sequential_us\":120}";
}

TEST(FlatJson, ReadsEveryKindOfValue) {
  FlatObject o;
  std::string error;
  ASSERT_TRUE(parse_flat_object(R"( {"s":"a\"b\\c\u0041", "n":-1.5e3, "t":true, "f":false, "z":null} )", o, error)) << error;
  EXPECT_EQ(o["s"].text, "a\"b\\cA");
  EXPECT_EQ(o["n"].number, -1500);
  EXPECT_TRUE(o["t"].boolean);
  EXPECT_EQ(o["f"].kind, JsonValue::Kind::kBool);
  EXPECT_EQ(o["z"].kind, JsonValue::Kind::kNull);
  ASSERT_TRUE(parse_flat_object("{}", o, error));
  EXPECT_TRUE(o.empty());
}

TEST(FlatJson, RefusesWhatIsNotOneFlatObjectSayingWhere) {
  FlatObject o;
  std::string error;
  for (const char* bad : {"", "[1]", "{\"a\":[1]}", "{\"a\":{}}", "{\"a\":1", "{\"a\" 1}", "{\"a\":1} x", "{\"a\":\"x}",
                          "{a:1}", "{\"a\":tru}",
                          // Numbers as JSON writes them, finite: no nan, inf, hex, leading '+' or zeros.
                          "{\"a\":nan}", "{\"a\":inf}", "{\"a\":-Infinity}", "{\"a\":1e400}", "{\"a\":0x10}",
                          "{\"a\":+1}", "{\"a\":01}", "{\"a\":1.}", "{\"a\":.5}", "{\"a\":1e}",
                          // \u escapes of exactly four hex digits.
                          "{\"a\":\"\\u00zz\"}", "{\"a\":\"\\u-041\"}", "{\"a\":\"\\u 41\"}"}) {
    EXPECT_FALSE(parse_flat_object(bad, o, error)) << bad;
    EXPECT_NE(error.find("column"), std::string::npos) << bad << ": " << error;
  }
}

TEST(TuningCache, FindsTheLastEntryForTheExactKey) {
  TuningCache c;
  c.add_text("{\"kind\":\"note\",\"text\":\"skipped\"}\n\n" + choice("ag", 4096, "pipelined", 2) + "\n" +
                 choice("ag", 4096, "fused", 1) + "\n" + choice("rs", 4096, "sequential", 0) + "\n",
             "test");
  EXPECT_EQ(c.size(), 3u);
  const Choice* ag = c.find(key(Op::kAllGatherMatmul, 4096, 3584, 8192));
  ASSERT_NE(ag, nullptr);
  EXPECT_EQ(ag->algorithm, Algorithm::kFused);  // the later line wins
  EXPECT_EQ(ag->chunks_per_rank, 1);
  EXPECT_TRUE(ag->from_cache);
  EXPECT_NE(ag->why.find("100.5"), std::string::npos) << ag->why;
  EXPECT_EQ(c.find(key(Op::kMatmulReduceScatter, 4096, 3584, 8192))->algorithm, Algorithm::kSequential);
  EXPECT_EQ(c.find(key(Op::kAllGatherMatmul, 4096, 3584, 8192, 4)), nullptr);  // another world size
  EXPECT_EQ(c.find(key(Op::kAllGatherMatmul, 4096, 3584, 4096)), nullptr);     // another K
  ProblemKey other_gpu = key(Op::kAllGatherMatmul, 4096, 3584, 8192);
  other_gpu.gpu = "NVIDIA H100 80GB HBM3";
  EXPECT_EQ(c.find(other_gpu), nullptr);
  ProblemKey fp16 = key(Op::kAllGatherMatmul, 4096, 3584, 8192);
  fp16.dtype = DType::kFP16;
  EXPECT_EQ(c.find(fp16), nullptr);
}

TEST(TuningCache, ABadLineIsAnErrorNamingTheFileAndLine) {
  std::vector<std::pair<std::string, std::string>> cases = {
      {"{\"kind\":\"choice\",", "not a flat JSON object"},
      {choice("ag", 4096, "magic", 0), "\"algorithm\" must be sequential, pipelined or fused"},
      {choice("xx", 4096, "fused", 0), "\"op\" must be"},
      {choice("ag", 4096, "fused", 99), "\"chunks_per_rank\" must be a whole number from 0 to 16"},
      {"{\"kind\":\"choice\",\"op\":\"ag\"}", "\"M\" must be a number"},
      {"{\"kind\":\"rates\",\"gpu\":\"g\",\"world_size\":2,\"gemm_tflops\":-1}", "\"gemm_tflops\" must be > 0"},
      {"{\"kind\":\"rates\",\"gpu\":\"g\",\"world_size\":2,\"nccl_fixed_us\":-3}", "\"nccl_fixed_us\" must be >= 0"},
      {"{\"kind\":\"rates\",\"gpu\":\"g\",\"world_size\":2,\"copy_gbps\":\"fast\"}", "\"copy_gbps\" must be a number"},
      {"{\"kind\":\"rates\",\"gpu\":\"g\",\"world_size\":0}", "\"world_size\" must be a whole number from 1"},
      {"{\"kind\":\"choice\",\"op\":\"ag\",\"M\":1e400}", "not a flat JSON object: number out of range"},
      {"{\"kind\":\"choice\",\"op\":\"ag\",\"M\":nan}", "not a flat JSON object"},
      {"{\"kind\":7}", "\"kind\" must be a string"},
  };
  // Sizes, world size and chunks are whole numbers in range: a fractional, negative or huge one would be
  // cast to an integer undefined or wrapped.
  for (const auto& [field, value] : std::vector<std::pair<std::string, std::string>>{
           {"M", "4096.5"}, {"M", "-4096"}, {"M", "0"}, {"N", "1e19"}, {"K", "9223372036854775807"},
           {"world_size", "2.5"}, {"world_size", "3e9"}, {"chunks_per_rank", "1.5"}, {"chunks_per_rank", "-1"}}) {
    std::string line = choice("ag", 4096, "fused", 2);
    const std::string at = "\"" + field + "\":";
    const size_t begin = line.find(at) + at.size(), end = line.find_first_of(",}", begin);
    line.replace(begin, end - begin, value);
    cases.push_back({line, "\"" + field + "\" must be"});
  }
  // The record of what was measured: a token asynctp-tune would not have written is refused too.
  for (const char* measured : {"fused/2=abc", "fused/x=3", "pipelined/99=3", "magic/2=3", "fused/2=-1", "fused2"}) {
    std::string line = choice("ag", 4096, "fused", 2);
    line.insert(line.size() - 1, std::string(",\"measured\":\"sequential=120 ") + measured + "\"");
    cases.push_back({line, "\"measured\""});
  }
  for (const auto& [line, expected] : cases) {
    TuningCache c;
    try {
      c.add_text("{\"kind\":\"note\"}\n" + line + "\n", "my.jsonl");
      ADD_FAILURE() << "accepted: " << line;
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("my.jsonl, line 2"), std::string::npos) << m;
      EXPECT_NE(m.find(expected), std::string::npos) << m;
    }
  }
}

TEST(TuningCache, RatesAreKeptPerGpuWorldSizeAndOp) {
  TuningCache c;
  c.add_text("{\"kind\":\"rates\",\"gpu\":\"NVIDIA H200\",\"world_size\":2,\"op\":\"rs\",\"gemm_tflops\":500,"
             "\"overlap_fixed_us\":30}\n{\"kind\":\"rates\",\"gpu\":\"NVIDIA H200\",\"world_size\":2,\"gemm_tflops\":600}\n",
             "test");
  EXPECT_EQ(c.rates("NVIDIA H200", 2, Op::kMatmulReduceScatter).gemm_tflops, 600);  // the later line, for both ops
  EXPECT_EQ(c.rates("NVIDIA H200", 2, Op::kAllGatherMatmul).gemm_tflops, 600);
  EXPECT_EQ(c.rates("NVIDIA H200", 4, Op::kAllGatherMatmul).gemm_tflops, Rates{}.gemm_tflops);  // the defaults
  TuningCache d;
  d.add_text("{\"kind\":\"rates\",\"gpu\":\"NVIDIA H200\",\"world_size\":2,\"op\":\"rs\",\"overlap_fixed_us\":30}", "t");
  EXPECT_EQ(d.rates("NVIDIA H200", 2, Op::kMatmulReduceScatter).overlap_fixed_us, 30);
  EXPECT_EQ(d.rates("NVIDIA H200", 2, Op::kAllGatherMatmul).overlap_fixed_us, Rates{}.overlap_fixed_us);
}

TEST(Model, SequentialForSmallProblemsAndWhereOverlappingSavesLittle) {
  const Rates r;
  // 256 x 4096 x 4096 on 2 ranks: a GEMM of a few microseconds.
  Choice c = model_choice(key(Op::kAllGatherMatmul, 256, 4096, 4096), r, true);
  EXPECT_EQ(c.algorithm, Algorithm::kSequential);
  EXPECT_NE(c.why.find("nothing worth hiding"), std::string::npos) << c.why;
  // Huge K, tiny N: moving A takes 20 times as long as multiplying it, so hiding the GEMM saves little.
  const ProblemKey thin = key(Op::kAllGatherMatmul, 8192, 32, 65536);
  EXPECT_GT(estimate(thin, r).copy_us, 20 * estimate(thin, r).gemm_us);
  c = model_choice(thin, r, true);
  EXPECT_EQ(c.algorithm, Algorithm::kSequential);
  EXPECT_NE(c.why.find("cannot hide"), std::string::npos) << c.why;
  EXPECT_NE(c.why.find("under 5%"), std::string::npos) << c.why;
  // One rank: nothing to communicate.
  EXPECT_EQ(model_choice(key(Op::kAllGatherMatmul, 16384, 8192, 8192, 1), r, true).algorithm, Algorithm::kSequential);
}

// The copy may outlast the GEMM and overlapping still pay: 4 ranks' reduce-scatter at 12288x7168x4096,
// with the rates fitted on 4xH200 (tuning/h200x4.jsonl), where fused measured 0.74-0.83x
// sequential's time (docs/performance.md).
TEST(Model, OverlapsWhereTheCopyOutlastsTheGemmButHidingTheGemmPays) {
  Rates r;
  r.gemm_tflops = 797.4, r.gemm_fixed_us = 22.1, r.copy_gbps = r.nccl_gbps = 311.7, r.nccl_fixed_us = 44.7;
  r.overlap_fixed_us = 79.3;
  const ProblemKey rs = key(Op::kMatmulReduceScatter, 12288, 7168, 4096, 4);
  const Estimate e = estimate(rs, r);
  EXPECT_GT(e.copy_us, e.gemm_us);
  EXPECT_LT(e.overlapped_us, kOverlapAtMost * e.sequential_us);
  EXPECT_EQ(model_choice(rs, r, true).algorithm, Algorithm::kFused);
}

TEST(Model, OverlapsLargeProblemsWithTheFusedKernelWhereItApplies) {
  const Rates r;
  const ProblemKey ag = key(Op::kAllGatherMatmul, 16384, 8192, 8192);
  const Estimate e = estimate(ag, r);
  EXPECT_LT(e.copy_us, e.gemm_us);
  EXPECT_LT(e.overlapped_us, e.sequential_us);
  EXPECT_EQ(model_choice(ag, r, true).algorithm, Algorithm::kFused);
  EXPECT_EQ(model_choice(ag, r, false).algorithm, Algorithm::kPipelined);
  // The estimates follow the formulas in docs/design/auto.md: FLOPs and bytes per rank.
  const double flops = 2.0 * 16384 * 8192 * 8192, bytes = 16384.0 * 8192 * 2 / 2;
  EXPECT_NEAR(e.gemm_us, flops / (r.gemm_tflops * 1e6) + r.gemm_fixed_us, 1e-6);
  EXPECT_NEAR(e.copy_us, bytes / (r.copy_gbps * 1e3), 1e-6);
  const Estimate rs = estimate(key(Op::kMatmulReduceScatter, 16384, 8192, 8192), r);
  EXPECT_NEAR(rs.gemm_us, flops / 2 / (r.gemm_tflops * 1e6) + r.gemm_fixed_us, 1e-6);
  EXPECT_NEAR(rs.copy_us, 16384.0 * 8192 * 2 / 2 / (r.copy_gbps * 1e3), 1e-6);
}

// fp8: A's bytes and the GEMM's time shrink (tune::kFp8GemmSpeedup); the model then overlaps with
// pipelined, the fused kernel's fp8 form being no faster at most seed shapes (docs/performance.md).
TEST(Model, Fp8CountsOneByteElementsAndAFasterGemmAndOverlapsPipelined) {
  const Rates r;
  ProblemKey ag = key(Op::kAllGatherMatmul, 4096, 3584, 8192);
  const Estimate bf16 = estimate(ag, r);
  ag.dtype = DType::kFP8E4M3;
  const Estimate fp8 = estimate(ag, r);
  EXPECT_NEAR(fp8.copy_us, bf16.copy_us / 2, 1e-6);
  EXPECT_NEAR(fp8.gemm_us - r.gemm_fixed_us, (bf16.gemm_us - r.gemm_fixed_us) / kFp8GemmSpeedup, 1e-6);
  EXPECT_EQ(model_choice(ag, r, true).algorithm, Algorithm::kPipelined);
  // The reduce-scatter's partial sums are the 16-bit output's.
  ProblemKey rs = key(Op::kMatmulReduceScatter, 4096, 3584, 8192);
  const double rs_copy = estimate(rs, r).copy_us;
  rs.dtype = DType::kFP8E4M3;
  EXPECT_NEAR(estimate(rs, r).copy_us, rs_copy, 1e-6);
  // A tuned fp8 shape is found by its dtype, and only by it.
  TuningCache c;
  std::string line = choice("ag", 4096, "fused", 1);
  line.replace(line.find("\"bf16\""), 6, "\"fp8 e4m3\"");
  c.add_text(line + "\n", "test");
  ASSERT_NE(c.find(ag), nullptr);
  EXPECT_EQ(c.find(ag)->algorithm, Algorithm::kFused);
  EXPECT_EQ(c.find(key(Op::kAllGatherMatmul, 4096, 3584, 8192)), nullptr);
  line.replace(line.find("\"fp8 e4m3\""), 10, "\"e4m3\"");
  try {
    TuningCache().add_text(line + "\n", "cache.jsonl");
    FAIL() << "an unknown dtype was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("\"fp8 e4m3\""), std::string::npos) << e.what();
  }
}

TEST(Model, ChooseTakesTheCacheFirst) {
  TuningCache c;
  c.add_text(choice("ag", 256, "pipelined", 4), "t");  // the model would say sequential
  ProblemKey k = key(Op::kAllGatherMatmul, 256, 3584, 8192);
  EXPECT_EQ(choose(k, c, true).algorithm, Algorithm::kPipelined);
  k.M = 512;
  EXPECT_FALSE(choose(k, c, true).from_cache);
}

TEST(Model, WithoutTheTunersRecordAnUntunedShapeFollowsTheNearestTunedShape) {
  TuningCache c;
  c.add_text(choice("rs", 2048, "fused", 4) + "\n" + choice("rs", 16384, "pipelined", 4) + "\n" +
                 choice("rs", 32768, "sequential", 0) + "\n" + choice("ag", 12288, "fused", 2) + "\n",
             "t");
  ProblemKey k = key(Op::kMatmulReduceScatter, 12288, 3584, 8192);  // nearest overlapped rs: 16384
  Choice got = choose(k, c, true);
  EXPECT_EQ(got.algorithm, Algorithm::kPipelined);
  EXPECT_EQ(got.chunks_per_rank, 0);  // 16384's chunks split other rows: the default
  EXPECT_FALSE(got.from_cache);
  EXPECT_NE(got.why.find("as tuned at 16384x3584x8192"), std::string::npos) << got.why;
  EXPECT_NE(got.why.find("its default chunks (no nearest tuned shape has this M)"), std::string::npos) << got.why;
  k.M = 3072;  // nearest: 2048, fused; where the fused kernel does not apply, pipelined
  EXPECT_EQ(choose(k, c, true).algorithm, Algorithm::kFused);
  EXPECT_EQ(choose(k, c, false).algorithm, Algorithm::kPipelined);
  EXPECT_EQ(choose(k, c, false).chunks_per_rank, 0);
  k.M = 16384, k.N = 4096;  // untuned, but 16384x3584x8192 has its M: its chunks
  got = choose(k, c, true);
  EXPECT_EQ(got.algorithm, Algorithm::kPipelined);
  EXPECT_EQ(got.chunks_per_rank, 4);
  EXPECT_NE(got.why.find("with 4 chunks as at 16384x3584x8192"), std::string::npos) << got.why;
  k.N = 3584;
  k.M = 256;  // the model says sequential: no neighbour overrides that
  EXPECT_EQ(choose(k, c, true).algorithm, Algorithm::kSequential);
  k.world_size = 4, k.M = 12288;  // no tuned shape of this world size: the model's own pick
  EXPECT_EQ(choose(k, c, true).algorithm, Algorithm::kFused);
  EXPECT_EQ(choose(k, c, true).chunks_per_rank, 0);
}

// A choice line with asynctp-tune's record of every candidate it timed there.
std::string with_measured(std::string line, const std::string& measured) {
  line.insert(line.size() - 1, ",\"measured\":\"" + measured + "\"");
  return line;
}

TEST(Model, AnUntunedShapeTakesTheCandidateThatLosesLeastAtTheNearestTunedShapes) {
  TuningCache c;
  c.add_text(with_measured(choice("rs", 8192, "pipelined", 4), "sequential=500 pipelined/0=330 pipelined/4=300 fused/2=306") +
                 "\n" +
                 with_measured(choice("rs", 16384, "pipelined", 4), "sequential=900 pipelined/0=650 pipelined/4=600 fused/2=640") +
                 "\n" + with_measured(choice("rs", 2048, "fused", 2), "sequential=160 pipelined/0=120 pipelined/4=150 fused/2=100") +
                 "\n",
             "t");
  // Nearest 8192 (pipelined/4), then 16384 and 2048. pipelined/4 is 1.5x the fastest at 2048, fused/2
  // at most 1.067x (at 16384): the nearest shape's own choice would be the worse bet.
  ProblemKey k = key(Op::kMatmulReduceScatter, 6144, 3584, 8192);
  Choice got = choose(k, c, true);
  EXPECT_EQ(got.algorithm, Algorithm::kFused);
  EXPECT_EQ(got.chunks_per_rank, 0);  // no nearest shape has 6144 rows: the default chunks
  EXPECT_NE(got.why.find("at most 1.067x the fastest at the nearest tuned shapes (8192x3584x8192, 16384x3584x8192, "
                         "2048x3584x8192)"),
            std::string::npos)
      << got.why;
  got = choose(k, c, false);  // without the fused kernel: pipelined/0 (at most 1.2x) over pipelined/4 (1.5x)
  EXPECT_EQ(got.algorithm, Algorithm::kPipelined);
  EXPECT_EQ(got.chunks_per_rank, 0);
  // With a tuned shape of the same M among the nearest (6144x3584x8192 for 6144x4096x8192), the
  // algorithm is still the least-regret one's (pipelined, at its best count the fastest at all three,
  // against fused's 1.072x), and the chunks those that measured fastest for it there (2, a count the
  // other shapes never timed).
  TuningCache same_m = c;
  same_m.add_text(with_measured(choice("rs", 6144, "pipelined", 2),
                                "sequential=400 pipelined/0=240 pipelined/2=235 pipelined/4=250 fused/2=252") +
                      "\n",
                  "t");
  ProblemKey wider = k;
  wider.N = 4096;
  got = choose(wider, same_m, true);
  EXPECT_EQ(got.algorithm, Algorithm::kPipelined);
  EXPECT_EQ(got.chunks_per_rank, 2);
  EXPECT_NE(got.why.find("with 2 chunks as at 6144x3584x8192"), std::string::npos) << got.why;
  // An algorithm not timed at every one of them is not taken.
  TuningCache partial;
  partial.add_text(with_measured(choice("rs", 8192, "fused", 4), "pipelined/4=302 fused/4=300") + "\n" +
                       with_measured(choice("rs", 2048, "pipelined", 4), "sequential=160 pipelined/4=150") + "\n",
                   "t");
  got = choose(k, partial, true);
  EXPECT_EQ(got.algorithm, Algorithm::kPipelined);
  EXPECT_EQ(got.chunks_per_rank, 0);
}

// Each algorithm is judged at its fastest chunk count at each nearest shape: the count is chosen on its
// own (chunks_for). A 2xH200 cache (tuning/h200x2.jsonl at af6b593) at rs 6144x5120x5120: pipelined was the fastest at all
// three nearest shapes, at 4 chunks at two of them and 1 at the third, and fused never; judged at one
// count across them, fused/2 lost least (1.07x) and was taken, and measured 1.15x pipelined.
TEST(Model, AnAlgorithmIsJudgedAtItsFastestChunkCountAtEachShape) {
  TuningCache c;
  c.add_text(with_measured(choice("rs", 8192, "pipelined", 4), "sequential=350 pipelined/0=236 pipelined/4=235 fused/2=252") +
                 "\n" +
                 with_measured(choice("rs", 16384, "pipelined", 4), "sequential=1030 pipelined/0=880 pipelined/4=775 fused/2=822") +
                 "\n" +
                 with_measured(choice("rs", 4096, "pipelined", 0), "sequential=252 pipelined/0=192 pipelined/4=212 fused/2=200") +
                 "\n",
             "t");
  const Choice got = choose(key(Op::kMatmulReduceScatter, 6144, 3584, 8192), c, true);
  EXPECT_EQ(got.algorithm, Algorithm::kPipelined);
  EXPECT_EQ(got.chunks_per_rank, 0);  // no nearest shape has 6144 rows
  EXPECT_NE(got.why.find("at most 1.000x the fastest"), std::string::npos) << got.why;
}

TEST(Model, TheNearestTunedShapesAreReadFromTheLineThatWins) {
  // The built-in cache's 8192 line, then a file measured later: only the later 8192 line counts. Read
  // with both, pipelined/4 would lose least (1.05x against fused/2's 1.06x at the stale 8192 line).
  TuningCache c;
  c.add_text(with_measured(choice("rs", 8192, "pipelined", 4), "sequential=500 pipelined/4=300 fused/2=318") + "\n" +
                 with_measured(choice("rs", 16384, "pipelined", 4), "sequential=900 pipelined/4=600 fused/2=630") + "\n",
             "built-in");
  c.add_text(with_measured(choice("rs", 8192, "fused", 2), "sequential=500 pipelined/4=315 fused/2=300") + "\n" +
                 with_measured(choice("rs", 2048, "fused", 2), "sequential=160 pipelined/4=150 fused/2=100") + "\n",
             "file");
  const Choice got = choose(key(Op::kMatmulReduceScatter, 6144, 3584, 8192), c, true);
  EXPECT_EQ(got.algorithm, Algorithm::kFused);
  EXPECT_EQ(got.chunks_per_rank, 0);
  EXPECT_NE(got.why.find("(8192x3584x8192, 16384x3584x8192, 2048x3584x8192)"), std::string::npos) << got.why;
  // A shape whose last line is sequential is not an overlapped neighbour, whatever an earlier line said.
  TuningCache later_sequential;
  later_sequential.add_text(with_measured(choice("rs", 8192, "pipelined", 4), "sequential=500 pipelined/4=300") + "\n" +
                                choice("rs", 8192, "sequential", 0) + "\n",
                            "t");
  EXPECT_TRUE(later_sequential.nearest_overlapped(key(Op::kMatmulReduceScatter, 6144, 3584, 8192), 3).empty());
}

TEST(Fit, RecoversTheRatesMeasurementsWereMadeWith) {
  Rates truth;
  truth.gemm_tflops = 650, truth.gemm_fixed_us = 5, truth.nccl_gbps = truth.copy_gbps = 280, truth.nccl_fixed_us = 20;
  truth.overlap_fixed_us = 0;
  std::vector<Measured> shapes;
  for (int64_t M : {1024, 4096, 16384}) {
    for (int64_t N : {3584, 8192}) {
      Measured m;
      m.key = key(Op::kAllGatherMatmul, M, N, 8192);
      const Estimate e = estimate(m.key, truth);
      m.gemm_us = e.gemm_us, m.comm_us = e.nccl_us, m.sequential_us = e.sequential_us;
      m.overlapped_us = e.overlapped_us + 10;  // every overlapped run 10 us over the model's bound
      shapes.push_back(m);
    }
  }
  const Rates r = fit_rates(shapes);
  EXPECT_NEAR(r.gemm_tflops, 650, 1);
  EXPECT_NEAR(r.gemm_fixed_us, 5, 0.1);
  EXPECT_NEAR(r.nccl_gbps, 280, 1);
  EXPECT_NEAR(r.nccl_fixed_us, 20, 0.1);
  EXPECT_NEAR(r.overlap_fixed_us, 10, 0.1);
  EXPECT_EQ(fit_rates({shapes[0]}).gemm_tflops, Rates{}.gemm_tflops);  // one shape: the defaults
}

TEST(TuningCache, AFileThatCannotBeReadIsAnErrorNamingIt) {
  try {
    tuning_cache("/nonexistent/asynctp.jsonl");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tuning cache '/nonexistent/asynctp.jsonl' cannot be read"), std::string::npos)
        << e.what();
  }
  EXPECT_GT(tuning_cache("").size(), 0u);  // the built-in one alone, which holds the 2xH200 entries
}

TEST(Resume, ReadsBackTheShapesAFileHolds) {
  const std::string path = "/tmp/asynctp_resume_test.jsonl";
  {
    std::ofstream out(path);
    out << "{\"kind\":\"note\"}\n"
        << "{\"kind\":\"choice\",\"gpu\":\"NVIDIA H200\",\"world_size\":2,\"op\":\"rs\",\"dtype\":\"bf16\",\"dim\":\"0\","
           "\"M\":4096,\"N\":3584,\"K\":8192,\"algorithm\":\"fused\",\"chunks_per_rank\":4,\"us\":208.7,"
           "\"sequential_us\":257.3,\"overlapped_us\":208.7,\"gemm_alone_us\":176,\"comm_alone_us\":90}\n"
        << choice("ag", 2048, "sequential", 0) << "\n";
  }
  const auto got = read_measured(path);
  ASSERT_EQ(got.size(), 2u);
  const ProblemKey rs = key(Op::kMatmulReduceScatter, 4096, 3584, 8192);
  ASSERT_EQ(got.count(problem_key_text(rs)), 1u) << problem_key_text(rs);
  const Measured& m = got.at(problem_key_text(rs));
  EXPECT_EQ(m.gemm_us, 176);
  EXPECT_EQ(m.comm_us, 90);
  EXPECT_EQ(m.overlapped_us, 208.7);
  EXPECT_EQ(got.count(problem_key_text(key(Op::kAllGatherMatmul, 2048, 3584, 8192))), 1u);
  EXPECT_EQ(got.count(problem_key_text(key(Op::kAllGatherMatmul, 2048, 3584, 8192, 4))), 0u);
  EXPECT_TRUE(read_measured("/nonexistent/none.jsonl").empty());  // a new file
  { std::ofstream(path, std::ios::app) << "{\"kind\":\"choice\",\"op\":\"ag\"}\n"; }
  EXPECT_THROW(read_measured(path), Error);
  std::remove(path.c_str());
}

// auto's key comes from the validated plan: every B's columns counted, K global for both ops.
TEST(ProblemKeys, ComeFromThePlan) {
  algo::AllGatherMatmulPlan ag;
  ag.M = 4096, ag.K = 512, ag.k_local = 512, ag.N = {768, 256}, ag.dtype = DType::kFP16;
  ProblemKey k = key_of(ag, 4, "g");
  EXPECT_EQ(k.op, Op::kAllGatherMatmul);
  EXPECT_EQ(k.M, 4096);
  EXPECT_EQ(k.N, 1024);
  EXPECT_EQ(k.K, 512);
  EXPECT_EQ(k.dtype, DType::kFP16);
  EXPECT_FALSE(k.last_dim);
  EXPECT_EQ(k.world_size, 4);
  EXPECT_EQ(k.gpu, "g");
  algo::MatmulReduceScatterPlan rs;
  rs.M = 64, rs.N = 16, rs.k_local = 32, rs.scatter_last = true;
  k = key_of(rs, 2, "g");
  EXPECT_EQ(k.op, Op::kMatmulReduceScatter);
  EXPECT_EQ(k.M, 64);
  EXPECT_EQ(k.N, 16);
  EXPECT_EQ(k.K, 64);
  EXPECT_TRUE(k.last_dim);
  EXPECT_TRUE(k.fused_kernel);
}

// A scaled call's key says whether the fused kernel's fp8 form takes it (algo::fused_scaled_unsupported),
// and where it does not, auto never picks fused for it.
TEST(ProblemKeys, AScaledCallsKeySaysWhetherTheFusedKernelTakesIt) {
  algo::AllGatherMatmulPlan ag;
  ag.M = 4096, ag.K = 8192, ag.k_local = 8192, ag.N = {3584}, ag.dtype = DType::kFP8E4M3;
  ag.scaling.scaled = true, ag.scaling.fast_accum = true;
  ProblemKey k = key_of(ag, 2, "g");
  EXPECT_EQ(k.dtype, DType::kFP8E4M3);
  EXPECT_TRUE(k.fused_kernel);
  EXPECT_TRUE(fused_kernel_applies(k));
  ag.scaling.rowwise = true;  // the all-gather's epilogue applies row-wise scales
  k = key_of(ag, 2, "g");
  EXPECT_TRUE(k.fused_kernel);
  EXPECT_TRUE(fused_kernel_applies(k));
  ag.scaling.bias = true;  // and a bias after them
  EXPECT_TRUE(key_of(ag, 2, "g").fused_kernel);
  ag.scaling.bias = false;
  ag.scaling.out_dtype = DType::kFP16;  // an fp16 product
  EXPECT_TRUE(key_of(ag, 2, "g").fused_kernel);
  ag.scaling.out_dtype = DType::kFP8E4M3;  // the bf16 product rounded to it after
  EXPECT_TRUE(key_of(ag, 2, "g").fused_kernel);
  ag.scaling.out_dtype = DType::kBF16, ag.scaling.b_dtype = DType::kFP8E5M2;
  EXPECT_FALSE(key_of(ag, 2, "g").fused_kernel);
  ag.scaling.b_dtype = DType::kFP8E4M3, ag.scaling.rowwise = false, ag.scaling.fast_accum = false;
  EXPECT_FALSE(key_of(ag, 2, "g").fused_kernel);
  algo::MatmulReduceScatterPlan rs;
  rs.M = 4096, rs.N = 3584, rs.k_local = 4096, rs.dtype = DType::kFP8E4M3;
  rs.scaling.scaled = true, rs.scaling.fast_accum = true;
  k = key_of(rs, 2, "g");
  EXPECT_TRUE(k.fused_kernel);
  EXPECT_TRUE(fused_kernel_applies(k));
  rs.scaling.rowwise = true;  // each rank's kernel scales its partial product by its row-wise scales
  EXPECT_TRUE(key_of(rs, 2, "g").fused_kernel);
  rs.scaling.fast_accum = false;
  EXPECT_FALSE(key_of(rs, 2, "g").fused_kernel);
  rs.scaling.fast_accum = true;
  rs.scaling.bias = true;  // every rank's kernel adds it to its partial product after the scales
  EXPECT_TRUE(key_of(rs, 2, "g").fused_kernel);
  rs.scaling.bias = false;
  // The choice for a key the fused kernel takes overlaps with pipelined where the model overlaps at all.
  TuningCache empty;
  k.gpu = "NVIDIA H200";
  ProblemKey big = k;
  big.M = 16384, big.N = 8192, big.K = 8192;
  EXPECT_EQ(choose(big, empty, fused_kernel_applies(big)).algorithm, Algorithm::kPipelined);
}

// A run stopped while it wrote a line leaves the file without its last newline: a resumed run cuts
// the partial line off (and measures that shape again); a whole last line only gets its newline.
TEST(Resume, ALineCutShortAtTheEndIsRemovedAndAWholeOneKept) {
  const std::string path = "/tmp/asynctp_truncated_test.jsonl";
  const std::string whole = choice("ag", 2048, "fused", 2) + "\n";
  { std::ofstream(path) << whole << choice("rs", 4096, "fused", 2).substr(0, 40); }
  EXPECT_THROW(read_measured(path), Error);  // as an interrupted run left it
  EXPECT_EQ(drop_truncated_last_line(path), choice("rs", 4096, "fused", 2).substr(0, 40));
  EXPECT_EQ(read_measured(path).size(), 1u);
  EXPECT_EQ(drop_truncated_last_line(path), "");  // nothing more to do
  { std::ofstream(path, std::ios::app) << choice("rs", 4096, "fused", 2); }  // whole, no newline
  EXPECT_EQ(drop_truncated_last_line(path), "");
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, whole + choice("rs", 4096, "fused", 2) + "\n");
  EXPECT_EQ(read_measured(path).size(), 2u);
  EXPECT_EQ(drop_truncated_last_line("/nonexistent/none.jsonl"), "");
  std::remove(path.c_str());
}

TEST(BuiltinTuning, ParsesAsAutoWillReadIt) {
  TuningCache c;
  EXPECT_NO_THROW(c.add_text(kBuiltinTuning, "built-in"));
}

}  // namespace
}  // namespace asynctp::tune
