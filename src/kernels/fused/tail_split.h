// Internal: how the fused GEMM splits its last, partly filled round of output tiles along K.
//
// A persistent kernel with T cluster tiles on C co-resident clusters takes ceil(T / C) rounds, and when
// T % C is small the last round leaves most clusters idle (4096 x 6656 with 128 x 256 tiles: 416
// cluster tiles on 66 clusters, 6 full rounds and 20 tiles in the 7th, so 14% of the kernel's time is
// that round at 30% occupancy). Splitting each of the last round's tiles `splits` ways along K lets
// `splits` clusters share it; the last split of a tile adds the others' fp32 partial sums, in a fixed
// order, before the epilogue (async_input_scheduler.cuh). A problem of less than one round (small M)
// is all tail. Host code only: the scheduler's set-up and the tile-width estimate both use it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels/fused/tile_shape.h"

namespace asynctp::kernels::fused {

// Beyond 4 ways the last split's reads of the partial sums (128 KiB each) cost more than they save.
constexpr int kMaxTailSplits = 4;
// A split takes at least this many K steps (tiles 128 bytes deep), so that the pipeline fills.
constexpr int64_t kMinKTilesPerSplit = 4;
// A tail after full rounds starts as the clusters finish their last whole tiles, at times that spread,
// and a split tile ends with its latest split: on an H100 each split beyond the first costs about
// what this many K steps do (docs/design/fused_all_gather_matmul.md, "The last round, split along K"). A
// problem of less than one round starts every split at once, and its splits cost only their K steps.
constexpr int64_t kSplitSpreadKTiles = 12;
// A tail after full rounds is split only where that brings it under this share of a round.
constexpr double kSplitTailMaxRounds = 0.8;
// Largest tile (128 x kWideTileN) and the consumer threads that hold it (two warpgroups).
constexpr int64_t kMaxTileElements = kTileRows * kWideTileN;
constexpr int64_t kConsumerThreads = 256;

struct TailSplit {
  int64_t whole = 0;   // cluster tiles computed whole, by every cluster in turn
  int64_t tail = 0;    // cluster tiles after those, each split `splits` ways along K
  int64_t splits = 1;  // 1: nothing is split
  double tail_rounds = 0;  // the split tail's length in rounds of whole tiles, as estimated
  int64_t units() const { return whole + tail * splits; }
};

// The estimated length, in rounds of whole tiles, of a last round split `splits` ways along K steps
// `k_tiles` deep, after full rounds (`after_full_rounds`) or as the whole problem.
inline double split_tail_rounds(int64_t splits, int64_t k_tiles, bool after_full_rounds) {
  const double spread = after_full_rounds ? static_cast<double>((splits - 1) * kSplitSpreadKTiles) / k_tiles : 0.0;
  return 1.0 / static_cast<double>(splits) + spread;
}

// The plan for `cluster_tiles` tiles on `clusters` clusters with `k_tiles` steps along K. A tail is
// split only where at most half the clusters would have work in the last round (every split of it then
// runs in that round, at the same time), the number of ways that makes it shortest, and after full
// rounds only where that is under kSplitTailMaxRounds. `max_splits` 1 splits nothing.
inline TailSplit plan_tail_split(int64_t cluster_tiles, int64_t clusters, int64_t k_tiles,
                                 int64_t max_splits = kMaxTailSplits) {
  TailSplit s;
  s.whole = cluster_tiles;
  if (clusters <= 0 || cluster_tiles <= 0) return s;
  const int64_t tail = cluster_tiles % clusters;
  if (tail == 0) return s;
  const bool after_full_rounds = cluster_tiles > clusters;
  const int64_t most = std::min<int64_t>({max_splits, kMaxTailSplits, clusters / tail, k_tiles / kMinKTilesPerSplit});
  int64_t best = 1;
  double best_rounds = 1.0;
  for (int64_t splits = 2; splits <= most; ++splits) {
    const double rounds = split_tail_rounds(splits, k_tiles, after_full_rounds);
    if (rounds < best_rounds) best = splits, best_rounds = rounds;
  }
  if (best < 2 || (after_full_rounds && best_rounds >= kSplitTailMaxRounds)) return s;
  s.whole = cluster_tiles - tail;
  s.tail = tail;
  s.splits = best;
  s.tail_rounds = best_rounds;
  return s;
}

// The kernel's length in rounds of whole tiles: full rounds, then the split tail's estimate.
inline double tail_split_rounds(const TailSplit& s, int64_t clusters) {
  if (clusters <= 0) return 0;
  const double full = static_cast<double>((s.whole + clusters - 1) / clusters);
  return s.tail > 0 ? full + s.tail_rounds : full;
}

// Workspace for any plan on a GPU of `sms` SMs: the tail's partial sums (at most one tile per SM,
// since tail * splits <= clusters) and one counter per tail tile and consumer thread. The counters
// must be zero before the first launch; every launch leaves them zero.
inline size_t tail_split_workspace_bytes(int sms) {
  const size_t tiles = static_cast<size_t>(std::max(sms, 0));
  return tiles * static_cast<size_t>(kMaxTileElements) * sizeof(float) +
         tiles * static_cast<size_t>(kConsumerThreads) * sizeof(uint32_t);
}

}  // namespace asynctp::kernels::fused
