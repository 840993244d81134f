// The fused all-gather GEMM's checks and its dispatch to a compiled instantiation.
#include "kernels/fused/ag_gemm.h"

#include <cstdint>
#include <limits>

#include "common/check.h"
#include "common/env.h"
#include "kernels/fused/ag_gemm_instances.h"

namespace asynctp::kernels::fused {
namespace {

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace

int pick_tile_n(int64_t M, int64_t N, int sms) {
  // A tile's time grows with its width, and the kernel takes as many rounds as its busiest SM has
  // tiles; 224 is taken only where it saves at least 5% of that estimate.
  auto cost = [&](int64_t tile_n) {
    const int64_t tiles = ((M + kTileRows - 1) / kTileRows) * ((N + tile_n - 1) / tile_n);
    return static_cast<double>((tiles + sms - 1) / sms) * static_cast<double>(tile_n);
  };
  return cost(224) < 0.95 * cost(256) ? 224 : 256;
}

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

int default_band_m() {
  // ASYNCTP_FUSED_BAND_M overrides the default for measurement (docs/fused.md has the sweep).
  static const int band = detail::env_positive_int("ASYNCTP_FUSED_BAND_M", 8);
  return band;
}

int sm_count() {
  int device = 0, count = 0;
  ASYNCTP_CUDA_CHECK(cudaGetDevice(&device));
  ASYNCTP_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
  return count;
}

int tile_n_for(const AgGemmArgs& a) {
  static const int forced = detail::env_positive_int("ASYNCTP_FUSED_TILE_N", 0);
  if (forced != 0) {
    ASYNCTP_CHECK(forced == 224 || forced == 256, "ASYNCTP_FUSED_TILE_N is ", forced, "; expected 224 or 256");
    return forced;
  }
  return pick_tile_n(a.M, a.N, sm_count());
}

template <DType kDType, BLayout kBLayout>
void launch_for_tile(const AgGemmArgs& a, int tile_n, cudaStream_t stream) {
  if (tile_n == 224) {
    launch_ag_gemm_instance<kDType, kBLayout, 224>(a, stream);
  } else {
    launch_ag_gemm_instance<kDType, kBLayout, 256>(a, stream);
  }
}

void run_ag_gemm(const AgGemmArgs& args, cudaStream_t stream) {
  const char* why = ag_gemm_unsupported(args);
  ASYNCTP_CHECK(*why == '\0', "fused all_gather_matmul: ", why);
  AgGemmArgs a = args;
  if (a.band_m <= 0) a.band_m = default_band_m();
  const int tile_n = tile_n_for(a);
  const bool row_b = a.b_layout == BLayout::kRowMajor;
  if (a.dtype == DType::kBF16) {
    row_b ? launch_for_tile<DType::kBF16, BLayout::kRowMajor>(a, tile_n, stream)
          : launch_for_tile<DType::kBF16, BLayout::kColMajor>(a, tile_n, stream);
  } else {
    row_b ? launch_for_tile<DType::kFP16, BLayout::kRowMajor>(a, tile_n, stream)
          : launch_for_tile<DType::kFP16, BLayout::kColMajor>(a, tile_n, stream);
  }
}

}  // namespace asynctp::kernels::fused
