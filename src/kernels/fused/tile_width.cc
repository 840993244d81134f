// The fused kernel's tile-width rules (fused_gemm.h): which width and schedule a problem takes, from
// its shape and the SMs it may fill. Host code only, no CUDA calls: the unit tests ask it directly.
#include <algorithm>
#include <cstdint>

#include "kernels/fused/fused_gemm.h"
#include "kernels/fused/tail_split.h"

namespace asynctp::kernels::fused {
namespace {

// The 2 x 1 clusters a persistent grid on `sms` SMs holds (at least one).
int64_t clusters_on(int sms) { return std::max(1, sms / static_cast<int>(kClusterRows / kTileRows)); }

}  // namespace

bool split_192_takes(int64_t M, int64_t N, int64_t K, int sms, int max_splits) {
  if (M <= kTileRows) return false;
  const int64_t clusters = clusters_on(sms);
  const int64_t k_tiles = (K + kTileK - 1) / kTileK;
  const int64_t tiles = (M + kClusterRows - 1) / kClusterRows * ((N + 192 - 1) / 192);
  const TailSplit split = plan_tail_split(tiles, clusters, k_tiles, max_splits);
  return split.whole == 0 && split.splits >= 3 && k_tiles >= kSplit192MinKTiles;
}

int tile_n_above_one_row(int64_t M, int64_t N, int64_t K, int sms, Element dtype, int max_splits,
                         bool split_192_allowed, bool wide_allowed) {
  const bool fp8 = dtype == Element::kFP8E4M3;
  if (!fp8 && split_192_allowed && split_192_takes(M, N, K, sms, max_splits)) return 192;
  const bool fp8_pingpong = fp8 && (K < kFp8PingpongBelowK || fp8_pingpong_fills_better(M, N, K, sms));
  if (pingpong_takes(M, N, sms, dtype) || fp8_pingpong) return kPingpongTileN;
  if (fp8) return 256;
  return pick_tile_n(M, N, K, sms, max_splits, wide_allowed);
}

// A round of kWideTileN-wide tiles takes about this much longer than its width alone says (three
// mainloop stages against four; fitted to one H200's times at 1024 x 5120 x 5120, 1280 x 4096 x 4096 and
// 768 x 6656 x 16384, docs/design/fused_all_gather_matmul.md).
constexpr double kWideTileRoundCost = 1.10;

int pick_tile_n(int64_t M, int64_t N, int64_t K, int sms, int max_splits, bool wide_allowed) {
  if (M <= kTileRows) return kOneRowTileN;
  // A tile's time grows with its width, and the kernel takes as many rounds as its busiest cluster
  // has tiles; the narrower tile is taken only where it saves at least 5% of that estimate (192-wide
  // tiles run a little below 256-wide ones: docs/design/fused_all_gather_matmul.md).
  const int64_t clusters = clusters_on(sms);
  const int64_t cluster_rows = (M + kClusterRows - 1) / kClusterRows;
  const int64_t k_tiles = (K + kTileK - 1) / kTileK;
  auto plan = [&](int64_t tile_n) {
    return plan_tail_split(cluster_rows * ((N + tile_n - 1) / tile_n), clusters, k_tiles, max_splits);
  };
  auto cost = [&](const TailSplit& split, int64_t tile_n) {
    return tail_split_rounds(split, clusters) * static_cast<double>(tile_n);
  };
  const double cost_192 = cost(plan(192), 192), cost_256 = cost(plan(256), 256);
  const int narrow_or_not = cost_192 < 0.95 * cost_256 ? 192 : 256;
  if (!wide_allowed) return narrow_or_not;
  // The wide tile likewise, against the better of the two, and only in whole rounds (split, it measured
  // slower than the narrower tiles' round).
  const TailSplit wide = plan(kWideTileN);
  if (wide.tail > 0) return narrow_or_not;
  const double best = narrow_or_not == 192 ? cost_192 : cost_256;
  return cost(wide, kWideTileN) * kWideTileRoundCost < 0.95 * best ? kWideTileN : narrow_or_not;
}

static_assert(kPingpongTileN == kOneRowTileN, "tile_n 128 names one-CTA clusters or the ping-pong schedule by the problem");

bool one_cta_takes(int64_t M, int64_t N, int sms, Element dtype) {
  if (dtype == Element::kFP8E4M3 || M <= kTileRows) return false;
  const int64_t tile_rows = (M + kTileRows - 1) / kTileRows;
  return tile_rows % 2 == 1 && tile_rows * ((N + kOneRowTileN - 1) / kOneRowTileN) <= sms;
}

double rounds_filled(int64_t M, int64_t N, int64_t tile_n, int sms) {
  const int64_t clusters = clusters_on(sms);
  const int64_t tiles = (M + kClusterRows - 1) / kClusterRows * ((N + tile_n - 1) / tile_n);
  const int64_t rounds = (tiles + clusters - 1) / clusters;
  return static_cast<double>(M) * static_cast<double>(N) /
         (static_cast<double>(rounds * clusters) * kClusterRows * static_cast<double>(tile_n));
}

bool fp8_pingpong_fills_better(int64_t M, int64_t N, int64_t K, int sms) {
  if (M <= kTileRows || K != kFp8PingpongBelowK) return false;
  const double cooperative = rounds_filled(M, N, 256, sms);
  return cooperative < kFp8CooperativeMinFilled && rounds_filled(M, N, kPingpongTileN, sms) > cooperative;
}

bool pingpong_192_takes(int64_t M, int64_t N, int64_t K, int sms) {
  const double filled = rounds_filled(M, N, kPingpongWideTileN, sms);
  return M > kTileRows && filled >= (K <= kPingpong192ShortK ? kPingpong192MinFilledShortK : kPingpong192MinFilled);
}

bool pingpong_takes(int64_t M, int64_t N, int sms, Element dtype) {
  if (M <= kTileRows) return false;
  const int64_t clusters = clusters_on(sms);
  const int64_t tiles = (M + kClusterRows - 1) / kClusterRows * ((N + kPingpongTileN - 1) / kPingpongTileN);
  return tiles <= (dtype == Element::kFP8E4M3 ? 3 : 1) * clusters;
}

}  // namespace asynctp::kernels::fused
