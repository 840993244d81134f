// The fused all-gather GEMM's checks, its launch's tile width and order (the width rules are
// tile_width.cc's), and its dispatch to a compiled instantiation.
#include "kernels/fused/fused_gemm.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <mutex>
#include <set>

#include "common/check.h"
#include "common/env.h"
#include "kernels/fused/fused_gemm_instances.h"
#include "kernels/fused/shard_rows.h"
#include "kernels/fused/staged_layout.h"
#include "kernels/fused/tail_split.h"
#include "kernels/fused/tile_order.h"

namespace asynctp::kernels::fused {
namespace {

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Rows of a reduce-scatter's cluster: one tile's in its one-CTA clusters, else two.
int64_t rs_cluster_rows(const FusedGemmArgs& a) {
  return reduce_scatter_one_cta_clusters(a.tile_n, a.rs.rows_per_rank) ? kTileRows : kClusterRows;
}

// Cluster rows the scheduler walks down before moving along N: deeper bands reuse B in L2 (a plain
// GEMM gains up to 5% at the large seed shapes with 8), but a band that spans several chunks makes
// its first tiles wait for the band's last chunk, so a band stays within one chunk. (A reduce-scatter's
// bands are a matter of correctness: reduce_scatter_band_m.)
// ASYNCTP_FUSED_BAND_M overrides it for measurement (docs/design/fused_all_gather_matmul.md).
int band_m_for(const FusedGemmArgs& a) {
  if (a.rs.rank >= 0) return reduce_scatter_band_m(a.rs.rows_per_rank, a.rs.rows_per_chunk, rs_cluster_rows(a));
  const int forced = detail::knob_int(detail::Knob::kFusedBandM, 0);
  if (forced > 0) return forced;
  constexpr int kDeepest = 8;
  if (a.chunks.flags == nullptr) return kDeepest;
  const int64_t chunk_cluster_rows = a.chunks.rows_per_chunk / kClusterRows;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(kDeepest, chunk_cluster_rows)));
}

// Whether the fp8 launch of `a` has an instantiation of width `tile_n`: 256, 128, and 192 (the ping-pong
// schedule's) with row-wise scales above one tile row; no 320.
bool fp8_width_taken(const FusedGemmArgs& a, int tile_n) {
  return tile_n == 256 || tile_n == kPingpongTileN ||
         (tile_n == kPingpongWideTileN && a.row_scales != nullptr && a.M > kTileRows);
}

}  // namespace

int tile_n_for(const FusedGemmArgs& a, int sms) {
  const int forced = forced_tile_n();
  const bool fp8 = a.dtype == Element::kFP8E4M3, row_scaled = a.row_scales != nullptr;
  if (forced != 0 && (!fp8 || fp8_width_taken(a, forced))) return forced;
  if (a.M <= kTileRows || one_cta_takes(a.M, a.N, sms, a.dtype)) return kOneRowTileN;
  const int max_splits = a.split_workspace != nullptr ? a.max_splits : 1;
  // Not where this rank's rows straddle a tile: on four H100s, 256 x 4096 x 4096 gathered from 64 rows a
  // rank timed out on every rank waiting for the first chunk, its 66 split units filling every SM; the
  // ping-pong schedule's 64 cluster tiles ran there before.
  const bool straddles = a.a_local != nullptr && shard_straddles_tiles(a.local_begin, a.local_end, a.M);
  const bool one_rank = a.a_local == nullptr || (a.local_begin == 0 && a.local_end >= a.M);
  const int tile_n = tile_n_above_one_row(a.M, a.N, a.K, sms, a.dtype, max_splits, !straddles, one_rank);
  if (!fp8 || !row_scaled || !pingpong_192_takes(a.M, a.N, a.K, sms)) return tile_n;
  // Row-wise: the 192-wide ping-pong tiles in place of the cooperative ones, and of the 128-wide ones
  // that K = 8192 gives (fp8_pingpong_fills_better) where those fill their rounds no better.
  if (tile_n == 256) return kPingpongWideTileN;
  const bool wide_fills_as_well =
      rounds_filled(a.M, a.N, kPingpongWideTileN, sms) >= rounds_filled(a.M, a.N, kPingpongTileN, sms);
  return tile_n == kPingpongTileN && fp8_pingpong_fills_better(a.M, a.N, a.K, sms) && wide_fills_as_well
             ? kPingpongWideTileN
             : tile_n;
}

namespace {

// Launches (or, kLoad, only loads) the fused GEMM's instantiation for kElement, kLayoutB, kTileN and
// the product kOut.
template <bool kLoad, Element kElement, Layout kLayoutB, Element kOut, int kTileN>
void launch_one(const FusedGemmArgs& a, cudaStream_t stream) {
  if constexpr (kLoad) {
    load_fused_gemm_instance<kElement, kLayoutB, kTileN, kOut>();
  } else {
    launch_fused_gemm_instance<kElement, kLayoutB, kTileN, kOut>(a, stream);
  }
}

// Whether a kOneRowTileN-wide launch of `a` runs one-CTA clusters (the instantiations of problems of one
// tile row), not the ping-pong schedule's 2 x 1.
bool one_cta_clusters(const FusedGemmArgs& a) {
  if (a.rs.rank >= 0) return reduce_scatter_one_cta_clusters(kOneRowTileN, a.rs.rows_per_rank);
  return a.M <= kTileRows || one_cta_takes(a.M, a.N, grid_sms(a), a.dtype);
}

// Launches (or, kLoad, only loads) the instantiation for problems of one tile row.
template <bool kLoad, Element kElement, Layout kLayoutB, Element kOut>
void launch_one_row(const FusedGemmArgs& a, cudaStream_t stream) {
  if constexpr (kLoad) {
    load_one_row_gemm_instance<kElement, kLayoutB, kOut>();
  } else {
    launch_one_row_gemm_instance<kElement, kLayoutB, kOut>(a, stream);
  }
}

// Launches (or, kLoad, only loads) the ping-pong schedule's instantiation.
template <bool kLoad, Element kElement, Layout kLayoutB, Element kOut = own_product(kElement)>
void launch_pingpong(const FusedGemmArgs& a, cudaStream_t stream) {
  if constexpr (kLoad) {
    load_pingpong_gemm_instance<kElement, kLayoutB, kOut>();
  } else {
    launch_pingpong_gemm_instance<kElement, kLayoutB, kOut>(a, stream);
  }
}

// The instantiation for kElement, kLayoutB and the product kOut that `a` needs: the two-rank
// reduce-scatter's, whose epilogue does the reduction, the one-CTA clusters' (one_cta_clusters), the
// ping-pong schedule's (tile_n kPingpongTileN elsewhere), or the fused GEMM's of width `tile_n`.
template <bool kLoad, Element kElement, Layout kLayoutB, Element kOut = own_product(kElement)>
void launch_typed(const FusedGemmArgs& a, int tile_n, cudaStream_t stream) {
  if (a.rs.rank >= 0 && a.rs.reduce_in_epilogue) {
    if constexpr (kLoad) {
      load_rs_gemm_instance<kElement, kLayoutB, kOut>();
    } else {
      launch_rs_gemm_instance<kElement, kLayoutB, kOut>(a, stream);
    }
  } else if (tile_n == kOneRowTileN && one_cta_clusters(a)) {
    launch_one_row<kLoad, kElement, kLayoutB, kOut>(a, stream);
  } else if (tile_n == kPingpongTileN) {
    launch_pingpong<kLoad, kElement, kLayoutB, kOut>(a, stream);
  } else if (tile_n == 192 || tile_n == kWideTileN) {
    if constexpr (kElement != Element::kFP8E4M3) {  // none for fp8
      tile_n == 192 ? launch_one<kLoad, kElement, kLayoutB, kOut, 192>(a, stream)
                    : launch_one<kLoad, kElement, kLayoutB, kOut, kWideTileN>(a, stream);
    }
  } else {
    launch_one<kLoad, kElement, kLayoutB, kOut, 256>(a, stream);
  }
}

// Launches (or, kLoad, only loads) fp8's instantiation with row-wise scales of kind kKind and product kOut.
template <bool kLoad, RowScaledKind kKind, Element kOut>
void launch_row_scaled(const FusedGemmArgs& a, cudaStream_t stream) {
  if constexpr (kLoad) {
    load_row_scaled_gemm_instance<kKind, kOut>();
  } else {
    launch_row_scaled_gemm_instance<kKind, kOut>(a, stream);
  }
}

// fp8's instantiations (B column-major only: fused_gemm_unsupported keeps the others out), of the
// product kOut.
template <bool kLoad, Element kOut>
void launch_fp8(const FusedGemmArgs& a, int tile_n, cudaStream_t stream) {
  if (a.row_scales == nullptr) {
    launch_typed<kLoad, Element::kFP8E4M3, Layout::kColMajor, kOut>(a, tile_n, stream);
  } else if (tile_n == 256) {  // row-wise scales: no reduce-scatter (fused_gemm_unsupported)
    launch_row_scaled<kLoad, RowScaledKind::kWide, kOut>(a, stream);
  } else if (tile_n == kPingpongWideTileN) {
    launch_row_scaled<kLoad, RowScaledKind::kPingpongWide, kOut>(a, stream);
  } else if (a.M <= kTileRows) {  // kOneRowTileN
    launch_row_scaled<kLoad, RowScaledKind::kOneRow, kOut>(a, stream);
  } else {  // kPingpongTileN
    launch_row_scaled<kLoad, RowScaledKind::kPingpong, kOut>(a, stream);
  }
}

// Loads fp8's instantiations of the product kOut.
template <Element kOut>
void load_fp8() {
  FusedGemmArgs a;
  a.dtype = Element::kFP8E4M3;
  a.b_layout = Layout::kColMajor;
  a.out = kOut;
  launch_typed</*kLoad=*/true, Element::kFP8E4M3, Layout::kColMajor, kOut>(a, 256, nullptr);
  launch_typed</*kLoad=*/true, Element::kFP8E4M3, Layout::kColMajor, kOut>(a, kOneRowTileN, nullptr);  // a.M = 0: one tile row's
  launch_pingpong</*kLoad=*/true, Element::kFP8E4M3, Layout::kColMajor, kOut>(a, nullptr);
  launch_row_scaled</*kLoad=*/true, RowScaledKind::kWide, kOut>(a, nullptr);
  launch_row_scaled</*kLoad=*/true, RowScaledKind::kOneRow, kOut>(a, nullptr);
  launch_row_scaled</*kLoad=*/true, RowScaledKind::kPingpong, kOut>(a, nullptr);
  launch_row_scaled</*kLoad=*/true, RowScaledKind::kPingpongWide, kOut>(a, nullptr);
  a.rs.rank = 0;
  a.rs.reduce_in_epilogue = true;
  launch_typed</*kLoad=*/true, Element::kFP8E4M3, Layout::kColMajor, kOut>(a, kRsTileN, nullptr);
}

template <bool kLoad>
void launch_dispatch(const FusedGemmArgs& a, int tile_n, cudaStream_t stream) {
  const bool row_b = a.b_layout == Layout::kRowMajor;
  if (a.dtype == Element::kFP8E4M3) {
    a.out == Element::kFP16 ? launch_fp8<kLoad, Element::kFP16>(a, tile_n, stream)
                            : launch_fp8<kLoad, Element::kBF16>(a, tile_n, stream);
  } else if (a.dtype == Element::kBF16) {
    row_b ? launch_typed<kLoad, Element::kBF16, Layout::kRowMajor>(a, tile_n, stream)
          : launch_typed<kLoad, Element::kBF16, Layout::kColMajor>(a, tile_n, stream);
  } else {
    row_b ? launch_typed<kLoad, Element::kFP16, Layout::kRowMajor>(a, tile_n, stream)
          : launch_typed<kLoad, Element::kFP16, Layout::kColMajor>(a, tile_n, stream);
  }
}

}  // namespace

int forced_tile_n() {
  const int forced = detail::knob_int(detail::Knob::kFusedTileN, 0);
  ASYNCTP_CHECK(forced == 0 || forced == kOneRowTileN || forced == 192 || forced == 256 || forced == kWideTileN,
                "ASYNCTP_FUSED_TILE_N is ", forced, "; expected ", kOneRowTileN, ", 192, 256 or ", kWideTileN);
  return forced;
}

int sm_count() {
  int device = 0, count = 0;
  ASYNCTP_CUDA_CHECK(cudaGetDevice(&device));
  ASYNCTP_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
  return count;
}

int grid_sms(const FusedGemmArgs& args) { return args.sms > 0 ? std::min(args.sms, sm_count()) : sm_count(); }

int reduce_scatter_band_m(int64_t rows_per_rank, int64_t rows_per_chunk, int64_t cluster_rows) {
  int64_t a = rows_per_rank / cluster_rows, b = rows_per_chunk / cluster_rows;
  while (b != 0) a %= b, std::swap(a, b);  // a = gcd
  for (int64_t band = std::min<int64_t>(8, a); band > 1; --band) {
    if (a % band == 0) return static_cast<int>(band);
  }
  return 1;
}

const char* fused_gemm_unsupported(const FusedGemmArgs& a) {
  if (a.dtype == Element::kFP8E4M3) {
    if (a.b_layout != Layout::kColMajor) return "the fused kernel takes fp8 B column-major only";
    if (a.out != Element::kBF16 && a.out != Element::kFP16) return "the fused kernel's fp8 product is bf16 or fp16";
    if (a.tile_n != 0 && !fp8_width_taken(a, a.tile_n)) {
      return "the fused kernel's fp8 tiles are 256 or 128 wide, or 192 with row-wise scales above one tile row";
    }
    if (a.N % 16 != 0 || a.K % 16 != 0) return "the fused kernel needs fp8 N and K to be multiples of 16";
    if ((a.row_scales == nullptr) != (a.col_scales == nullptr)) return "the fused kernel takes row and column scales together";
    const bool rs_rows = a.rs.row_scales != nullptr;
    if (rs_rows != (a.rs.col_scales != nullptr) || (rs_rows && a.rs.partial_scale != nullptr)) {
      return "the fused reduce-scatter takes row and column scales together, in place of a partial scale";
    }
    if (a.row_scales != nullptr) {
      if (a.rs.rank >= 0) return "the fused kernel's reduce-scatter takes its row-wise scales in ReduceScatterTiles";
      if (!aligned16(a.row_scales) || !aligned16(a.col_scales)) {
        return "the fused kernel needs row-wise scales to start on 16-byte boundaries";
      }
    }
    if (a.bias != nullptr) {
      if (a.rs.rank >= 0) return "the fused kernel's reduce-scatter takes its bias in ReduceScatterTiles";
      if (!aligned16(a.bias)) return "the fused kernel needs the bias to start on a 16-byte boundary";
    }
    if (a.rs.bias != nullptr && (!aligned16(a.rs.bias) || a.rs.cols != a.N)) {
      return "the fused reduce-scatter needs its bias on a 16-byte boundary, with cols = N";
    }
    if (a.rs.bias != nullptr && a.rs.partial_scale == nullptr && a.rs.row_scales == nullptr) {
      return "the fused reduce-scatter takes a bias with the scaled op's scales only";
    }
  } else if (a.row_scales != nullptr || a.col_scales != nullptr || a.rs.row_scales != nullptr) {
    return "the fused kernel takes row-wise scales for fp8 only";
  } else if (a.bias != nullptr || a.rs.bias != nullptr) {
    return "the fused kernel takes a bias for fp8 only";
  } else if (a.rs.partial_scale != nullptr) {
    return "the fused kernel's reduce-scatter takes a partial scale for fp8 only";
  } else if (a.dtype != Element::kBF16 && a.dtype != Element::kFP16) {
    return "the fused kernel takes bf16, fp16 or fp8 e4m3";
  }
  if (a.N % 8 != 0 || a.K % 8 != 0) return "the fused kernel needs N and K to be multiples of 8 (16-byte rows for TMA)";
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  if (a.M > kMax || a.N > kMax || a.K > kMax) return "the fused kernel indexes M, N and K with 32-bit integers";
  if (!aligned16(a.a) || !aligned16(a.b) || !aligned16(a.c)) {
    return "the fused kernel needs A, B and C to start on 16-byte boundaries";
  }
  return "";
}

void load_fused_gemm_kernels() {
  static std::mutex mu;
  static std::set<int> loaded;
  int device = 0;
  ASYNCTP_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mu);
  if (!loaded.insert(device).second) return;
  for (bool reduce_in_epilogue : {false, true}) {
    for (int tile_n : {256, 192, kWideTileN, kOneRowTileN}) {
      for (Element dtype : {Element::kBF16, Element::kFP16}) {
        for (Layout layout : {Layout::kRowMajor, Layout::kColMajor}) {
          FusedGemmArgs a;
          a.dtype = dtype;
          a.b_layout = layout;
          a.rs.rank = reduce_in_epilogue ? 0 : -1;
          a.rs.reduce_in_epilogue = reduce_in_epilogue;
          if (reduce_in_epilogue && tile_n != kRsTileN) continue;
          launch_dispatch</*kLoad=*/true>(a, tile_n, nullptr);  // a.M = 0: kOneRowTileN is one tile row's
        }
      }
    }
  }
  launch_pingpong</*kLoad=*/true, Element::kBF16, Layout::kRowMajor>(FusedGemmArgs{}, nullptr);
  launch_pingpong</*kLoad=*/true, Element::kBF16, Layout::kColMajor>(FusedGemmArgs{}, nullptr);
  launch_pingpong</*kLoad=*/true, Element::kFP16, Layout::kRowMajor>(FusedGemmArgs{}, nullptr);
  launch_pingpong</*kLoad=*/true, Element::kFP16, Layout::kColMajor>(FusedGemmArgs{}, nullptr);
  load_fp8<Element::kBF16>();
  load_fp8<Element::kFP16>();
}

void run_fused_gemm(const FusedGemmArgs& args, cudaStream_t stream) {
  const char* why = fused_gemm_unsupported(args);
  ASYNCTP_CHECK(*why == '\0', "fused GEMM: ", why);
  FusedGemmArgs a = args;
  if (a.band_m <= 0) a.band_m = band_m_for(a);
  if (a.max_splits <= 0) a.max_splits = detail::knob_int(detail::Knob::kFusedMaxSplits, kMaxTailSplits);
  ASYNCTP_CHECK(a.tile_n == 0 || a.tile_n == kOneRowTileN || a.tile_n == 192 || a.tile_n == 256 ||
                    a.tile_n == kWideTileN,
                "fused GEMM: tile_n is ", a.tile_n, "; expected 0, ", kOneRowTileN, ", 192, 256 or ", kWideTileN);
  ASYNCTP_CHECK(a.rs.rank < 0 || a.tile_n == 0 || a.tile_n == kRsTileN ||
                    ((a.tile_n == 192 || a.tile_n == kWideTileN || a.tile_n == kOneRowTileN) && !a.rs.reduce_in_epilogue),
                "fused reduce-scatter: tile_n is ", a.tile_n, "; expected ", kRsTileN, ", or 192, ", kWideTileN, " or ",
                kOneRowTileN,
                " where the reduction runs in fixup() or the ping-pong schedule's epilogue (reduce_scatter_tile_n)");
  ASYNCTP_CHECK(a.rs.rank < 0 || a.rs.rows_per_rank % rs_cluster_rows(a) == 0, "fused reduce-scatter: ",
                a.rs.rows_per_rank, " rows per rank are not whole clusters of ", rs_cluster_rows(a),
                " rows (reduce_scatter_tile_n)");
  ASYNCTP_CHECK(!a.rs.reduce_in_epilogue || (a.rs.rank >= 0 && a.rs.world == 2),
                "fused reduce-scatter: the reduction in the epilogue takes two ranks, not ", a.rs.world);
  const int tile_n = a.tile_n != 0 ? a.tile_n : a.rs.rank >= 0 ? static_cast<int>(kRsTileN) : tile_n_for(a, grid_sms(a));
  ASYNCTP_CHECK(a.dtype != Element::kFP8E4M3 || fp8_width_taken(a, tile_n),
                "fused GEMM: the fp8 kernel's tiles are 256 or ", kPingpongTileN, " wide, or ", kPingpongWideTileN,
                " with row-wise scales above one tile row; tile_n is ", tile_n);
  launch_dispatch</*kLoad=*/false>(a, tile_n, stream);
}

}  // namespace asynctp::kernels::fused
