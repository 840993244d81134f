// The fused all-gather GEMM's checks, its tile order, and its dispatch to a compiled instantiation.
#include "kernels/fused/ag_gemm.h"

#include <algorithm>
#include <cstdint>
#include <limits>

#include "common/check.h"
#include "common/env.h"
#include "kernels/fused/ag_gemm_instances.h"

namespace asynctp::kernels::fused {
namespace {

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Cluster rows the scheduler walks down before moving along N: deeper bands reuse B in L2 (a plain
// GEMM gains up to 5% at the large seed shapes with 8), but a band that spans several pieces makes
// its first tiles wait for the band's last piece, so a band stays within one piece.
// ASYNCTP_FUSED_BAND_M overrides it for measurement (docs/fused.md has the sweep).
int band_m_for(const AgGemmArgs& a) {
  static const int forced = detail::env_positive_int("ASYNCTP_FUSED_BAND_M", 0);
  if (forced > 0) return forced;
  constexpr int kDeepest = 8;
  if (a.chunks.flags == nullptr) return kDeepest;
  const int64_t piece_cluster_rows = a.chunks.rows_per_piece / kClusterRows;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(kDeepest, piece_cluster_rows)));
}

}  // namespace

const char* ag_gemm_unsupported(const AgGemmArgs& a) {
  if (a.dtype != DType::kBF16 && a.dtype != DType::kFP16) return "the fused kernel takes bf16 or fp16";
  if (a.N % 8 != 0 || a.K % 8 != 0) return "the fused kernel needs N and K to be multiples of 8 (16-byte rows for TMA)";
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  if (a.M > kMax || a.N > kMax || a.K > kMax) return "the fused kernel indexes M, N and K with 32-bit integers";
  if (!aligned16(a.a) || !aligned16(a.b) || !aligned16(a.c)) {
    return "the fused kernel needs A, B and C to start on 16-byte boundaries";
  }
  return "";
}

void run_ag_gemm(const AgGemmArgs& args, cudaStream_t stream) {
  const char* why = ag_gemm_unsupported(args);
  ASYNCTP_CHECK(*why == '\0', "fused all_gather_matmul: ", why);
  AgGemmArgs a = args;
  if (a.band_m <= 0) a.band_m = band_m_for(a);
  const bool row_b = a.b_layout == BLayout::kRowMajor;
  if (a.dtype == DType::kBF16) {
    row_b ? launch_ag_gemm_instance<DType::kBF16, BLayout::kRowMajor, 256>(a, stream)
          : launch_ag_gemm_instance<DType::kBF16, BLayout::kColMajor, 256>(a, stream);
  } else {
    row_b ? launch_ag_gemm_instance<DType::kFP16, BLayout::kRowMajor, 256>(a, stream)
          : launch_ag_gemm_instance<DType::kFP16, BLayout::kColMajor, 256>(a, stream);
  }
}

}  // namespace asynctp::kernels::fused
