// asynctp-bench's command line and JSON writer.
#include <gtest/gtest.h>

#include "asynctp/error.h"
#include "bench/cli.h"
#include "bench/json.h"

namespace asynctp::bench {
namespace {

TEST(BenchCli, Defaults) {
  const Args a = parse_args({});
  EXPECT_EQ(a.shapes.size(), 4u);
  EXPECT_EQ(a.shapes[0].M, 4096);
  EXPECT_EQ(a.shapes[3].N, 8192);
  EXPECT_TRUE(a.run_ag && a.run_rs);
  EXPECT_EQ(a.dtype, DType::kBF16);
  EXPECT_EQ(a.algorithms, std::vector<Algorithm>{Algorithm::kSequential});
}

TEST(BenchCli, EveryOption) {
  const Args a = parse_args({"--gpus", "2", "--ranks-per-gpu", "3", "--shapes", "128x256x512,7x9x11", "--op", "rs", "--dtype", "fp16",
                             "--gather-dim", "last", "--scatter-dim", "last", "--b-layout", "col", "--algorithms",
                             "sequential,fused", "--chunks", "3", "--iters", "5", "--warmup", "0", "--flush-l2", "--json", "/tmp/x.json"});
  EXPECT_EQ(a.gpus, 2);
  EXPECT_EQ(a.ranks_per_gpu, 3);
  ASSERT_EQ(a.shapes.size(), 2u);
  EXPECT_EQ(a.shapes[1].M, 7);
  EXPECT_EQ(a.shapes[1].K, 11);
  EXPECT_FALSE(a.run_ag);
  EXPECT_TRUE(a.run_rs);
  EXPECT_EQ(a.dtype, DType::kFP16);
  EXPECT_TRUE(a.gather_last && a.scatter_last && a.flush_l2);
  EXPECT_EQ(a.b_layout, BLayout::kColMajor);
  EXPECT_EQ(a.algorithms, (std::vector<Algorithm>{Algorithm::kSequential, Algorithm::kFused}));
  EXPECT_EQ(a.chunks_per_rank, 3);
  EXPECT_EQ(a.iters, 5);
  EXPECT_EQ(a.warmup, 0);
  EXPECT_EQ(a.json, "/tmp/x.json");
}

TEST(BenchCli, Fp8TakesItsScalesAndAColumnMajorB) {
  const Args a = parse_args({"--dtype", "e4m3", "--scales", "row", "--algorithms", "sequential,pipelined,fused,auto"});
  EXPECT_EQ(a.dtype, DType::kFP8E4M3);
  EXPECT_TRUE(a.rowwise_scales);
  EXPECT_EQ(a.b_layout, BLayout::kColMajor);  // without --b-layout
  EXPECT_FALSE(parse_args({"--dtype", "e4m3"}).rowwise_scales);
  EXPECT_TRUE(parse_args({"--dtype", "e4m3", "--fast-accum"}).fast_accum);
  EXPECT_TRUE(parse_args({"--dtype", "e4m3", "--bias"}).bias);
  EXPECT_FALSE(parse_args({"--dtype", "e4m3"}).bias);
  EXPECT_EQ(parse_args({"--dtype", "e4m3"}).out_dtype, DType::kBF16);
  EXPECT_EQ(parse_args({"--dtype", "e4m3", "--out-dtype", "fp16"}).out_dtype, DType::kFP16);
}

TEST(BenchCli, BadValuesNameTheOption) {
  auto msg = [](std::vector<std::string> argv) {
    try {
      parse_args(argv);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("<no error>");
  };
  EXPECT_NE(msg({"--shapes", "4096x3584"}).find("--shapes '4096x3584' is not valid; expected MxNxK"), std::string::npos);
  EXPECT_NE(msg({"--shapes", "0x1x1"}).find("--shapes '0' is not valid"), std::string::npos);
  EXPECT_NE(msg({"--op", "ar"}).find("--op 'ar' is not valid; expected ag, rs or both"), std::string::npos);
  EXPECT_NE(msg({"--algorithms", "sequential,magic"}).find("--algorithms 'magic'"), std::string::npos);
  EXPECT_NE(msg({"--gather-dim", "1"}).find("expected 0 or last"), std::string::npos);
  EXPECT_NE(msg({"--iters", "0"}).find("--iters '0' is not valid; expected an integer from 1 to 2147483647"), std::string::npos);
  EXPECT_NE(msg({"--iters"}).find("--iters needs a value"), std::string::npos);
  EXPECT_NE(msg({"--ranks-per-gpu", "0"}).find("--ranks-per-gpu '0' is not valid; expected an integer from 1 to"),
            std::string::npos);
  EXPECT_NE(msg({"--chunks", "17"}).find("--chunks '17' is not valid; expected an integer from 0 to 16"), std::string::npos);
  EXPECT_NE(msg({"--frobnicate", "1"}).find("unknown option --frobnicate"), std::string::npos);
  EXPECT_NE(msg({"--dtype", "e5m2"}).find("--dtype 'e5m2' is not valid; expected bf16, fp16 or e4m3"), std::string::npos);
  EXPECT_NE(msg({"--scales", "block"}).find("--scales 'block' is not valid; expected tensor or row"), std::string::npos);
  EXPECT_NE(msg({"--scales", "row"}).find("--scales is for --dtype e4m3 only"), std::string::npos);
  EXPECT_NE(msg({"--fast-accum"}).find("--fast-accum is for --dtype e4m3 only"), std::string::npos);
  EXPECT_NE(msg({"--bias"}).find("--bias is for --dtype e4m3 only"), std::string::npos);
  EXPECT_NE(msg({"--out-dtype", "fp16"}).find("--out-dtype is for --dtype e4m3 only"), std::string::npos);
  EXPECT_NE(msg({"--dtype", "e4m3", "--out-dtype", "e4m3"}).find("--out-dtype 'e4m3' is not valid; expected bf16 or fp16"),
            std::string::npos);
  EXPECT_NE(msg({"--dtype", "e4m3", "--b-layout", "row"}).find("fp8 B is column-major only"), std::string::npos);
  // Numbers past what the option's int holds are refused, not cut to 32 bits (4294967298 was 2 GPUs,
  // 4294967296 iterations 0, 4294967297 chunks 1).
  EXPECT_NE(msg({"--gpus", "4294967298"}).find("--gpus '4294967298' is not valid; expected an integer from 1 to"),
            std::string::npos);
  EXPECT_NE(msg({"--iters", "4294967296"}).find("--iters '4294967296' is not valid"), std::string::npos);
  EXPECT_NE(msg({"--warmup", "2147483648"}).find("--warmup '2147483648' is not valid"), std::string::npos);
  EXPECT_NE(msg({"--chunks", "4294967297"}).find("--chunks '4294967297' is not valid; expected an integer from 0 to 16"),
            std::string::npos);
  EXPECT_NE(msg({"--ranks-per-gpu", "99999999999"}).find("--ranks-per-gpu '99999999999' is not valid"),
            std::string::npos);
  EXPECT_NE(msg({"--shapes", "99999999999999999999x1x1"}).find("--shapes '99999999999999999999' is not valid"),
            std::string::npos);
  EXPECT_NE(msg({"--gpus", " 2"}).find("--gpus ' 2' is not valid"), std::string::npos);
  // No shapes at all, or an empty one in the list, is refused rather than running nothing.
  EXPECT_NE(msg({"--shapes", ""}).find("--shapes '' is not valid"), std::string::npos);
  EXPECT_NE(msg({"--shapes", "seeds,"}).find("--shapes '' is not valid"), std::string::npos);
  EXPECT_NE(msg({"--algorithms", ""}).find("--algorithms '' is not valid"), std::string::npos);
  // A --json file that cannot be written is refused before the run, not after it.
  EXPECT_NE(msg({"--json", "/nonexistent-dir/x.json"}).find("--json '/nonexistent-dir/x.json' cannot be written"),
            std::string::npos);
  EXPECT_NE(msg({"--json", ""}).find("--json '' is not valid"), std::string::npos);
}

TEST(BenchJson, OneObjectPerLineWithEscapesAndNulls) {
  JsonLine j;
  j.add("op", "ag").add("M", int64_t{4096}).add("median_us", 328.5).add("correct", true);
  j.add("gpu", "NVIDIA \"H200\"\n").add("tflops", 0.0 / 0.0);
  EXPECT_EQ(j.str(),
            "{\"op\":\"ag\",\"M\":4096,\"median_us\":328.5,\"correct\":true,\"gpu\":\"NVIDIA \\\"H200\\\"\\n\","
            "\"tflops\":null}");
  EXPECT_EQ(json_escape(std::string("a\x01") + "b"), "\"a\\u0001b\"");
}

}  // namespace
}  // namespace asynctp::bench
