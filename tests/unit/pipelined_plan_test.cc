// The pipelined algorithm's pure decisions: how rows are cut into chunks, how many chunks a call uses,
// and how the reduce-scatter sums what lands.
#include <gtest/gtest.h>

#include <cstdlib>

#include "algo/pipelined.h"
#include "asynctp/error.h"

namespace asynctp::algo {
namespace {

TEST(PipelinedChunks, RowsAreCutIntoNearlyEqualChunksThatCoverEveryRowOnce) {
  for (int64_t rows : {1, 7, 65, 1024, 4097}) {
    for (int chunks : {1, 2, 3, 16}) {
      int64_t next = 0;
      for (int i = 0; i < chunks; ++i) {
        const RowRange r = chunk_rows(rows, chunks, i);
        EXPECT_EQ(r.begin, next);
        EXPECT_LE(r.size(), rows / chunks + 1);
        EXPECT_GE(r.size(), rows / chunks);
        next = r.end;
      }
      EXPECT_EQ(next, rows);
    }
  }
}

TEST(PipelinedChunks, DefaultsAndClamping) {
  EXPECT_EQ(resolve_chunks(0, /*gather_last=*/false, 4096), 1);
  EXPECT_EQ(resolve_chunks(0, /*gather_last=*/true, 4096), 2);
  EXPECT_EQ(resolve_chunks(5, false, 4096), 5);
  EXPECT_EQ(resolve_chunks(16, false, 3), 3);  // never more chunks than rows
  EXPECT_EQ(resolve_chunks(4, false, 0), 1);
}

TEST(PipelinedReduceScatterSum, InTheGemmOnlyOnTwoRanksWithLargeChunks) {
  EXPECT_EQ(resolve_rs_sum(2, 8192, RsSum::kDefault), RsSum::kInGemm);
  EXPECT_EQ(resolve_rs_sum(2, 2048, RsSum::kDefault), RsSum::kKernel);
  EXPECT_EQ(resolve_rs_sum(2, 2048, RsSum::kInGemm), RsSum::kInGemm);
  EXPECT_EQ(resolve_rs_sum(2, 8192, RsSum::kKernel), RsSum::kKernel);
  // With more ranks several partials land: the kernel sums them, whatever was asked.
  EXPECT_EQ(resolve_rs_sum(4, 8192, RsSum::kInGemm), RsSum::kKernel);
  EXPECT_EQ(resolve_rs_sum(8, 8192, RsSum::kDefault), RsSum::kKernel);
}

TEST(PipelinedReduceScatterSum, EnvironmentOverride) {
  unsetenv("ASYNCTP_PIPELINED_RS_SUM");
  EXPECT_EQ(rs_sum_from_env(), RsSum::kDefault);
  setenv("ASYNCTP_PIPELINED_RS_SUM", "gemm", 1);
  EXPECT_EQ(rs_sum_from_env(), RsSum::kInGemm);
  setenv("ASYNCTP_PIPELINED_RS_SUM", "kernel", 1);
  EXPECT_EQ(rs_sum_from_env(), RsSum::kKernel);
  setenv("ASYNCTP_PIPELINED_RS_SUM", "fast", 1);
  try {
    rs_sum_from_env();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ASYNCTP_PIPELINED_RS_SUM='fast' is not one of its values (expected gemm or kernel)"),
              std::string::npos)
        << e.what();
  }
  unsetenv("ASYNCTP_PIPELINED_RS_SUM");
}

}  // namespace
}  // namespace asynctp::algo
