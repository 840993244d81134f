// Internal: where the fused reduce-scatter's staged tiles lie, and how a rank's rows are cut into the
// chunks the copy engine pushes. Host code only; shared by the op (algo/fused_matmul_reduce_scatter.cc)
// and asynctp-rs-lab (tools/rs_lab/), which must stage and push exactly as the op does.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels/fused/fused_gemm.h"
#include "kernels/fused/tail_split.h"

namespace asynctp::kernels::fused {

// Whether a reduce-scatter of `rows_per_rank` rows a rank (whole 128-row tiles) runs one-CTA clusters: an
// odd number of tile rows, where a 2 x 1 cluster would hold two ranks' rows.
inline bool reduce_scatter_one_cta(int64_t rows_per_rank) { return rows_per_rank % kClusterRows != 0; }

// Whether a reduce-scatter's M x N x K partial product in fp8 with row-wise scales (`row_scales`) runs
// the ping-pong schedule where the all-gather's rule would give it the cooperative 256-wide tiles: at K
// up to kFp8PingpongBelowK. Its cooperative kernel scales each tile in fixup(), an epilogue that no
// mainloop overlaps and that the ping-pong schedule hides; timed on one H200 (the two schedules forced
// in turn, four times, the kernel alone at one rank), the ping-pong kernel took 3.3% and 6% less time at
// 16384 x 8192 x 8192 and 8192 x 8192 x 8192, and as long at 16384 x 4096 x 14336 (tensor-wise: as
// long to 4% longer, so not there; docs/design/fused_matmul_reduce_scatter.md).
inline bool rowwise_rs_pingpong_takes(Element dtype, bool row_scales, int64_t K) {
  return dtype == Element::kFP8E4M3 && row_scales && K <= kFp8PingpongBelowK;
}

// The width of a reduce-scatter's tiles for an M x N x K partial product of `rows_per_rank` rows a rank
// on `sms` SMs, which every rank computes alike (the staged layout and the counts follow it):
//  - rows per rank an odd multiple of kTileRows: kOneRowTileN, in one-CTA clusters (the instantiation
//    of problems of one tile row), since a 2 x 1 cluster would hold two ranks' rows;
//  - where the two-rank reduction runs in the epilogue (its instantiations): kRsTileN;
//  - else what an all-gather's kernel of the same problem takes (tile_n_above_one_row; the ping-pong
//    schedule reduces in its epilogue: pingpong_epilogue.cuh), counted with the split last round
//    whether or not this rank has the split's workspace, and kWideTileN at one rank only;
//  - fp8 with row-wise scales (`row_scales`) where that gives the cooperative 256-wide tiles and K is at
//    most kFp8PingpongBelowK: kPingpongTileN (rowwise_rs_pingpong_takes);
//  - ASYNCTP_FUSED_TILE_N (set alike on every rank; forced_tile_n) overrides the last for measurement
//    where it names kPingpongTileN (the ping-pong schedule), 256, or 192 in 16 bits.
inline int reduce_scatter_tile_n(bool reduce_in_epilogue, Element dtype, int64_t M, int64_t N, int64_t K,
                                 int64_t rows_per_rank, int sms, bool row_scales = false) {
  if (reduce_scatter_one_cta(rows_per_rank)) return kOneRowTileN;
  if (reduce_in_epilogue) return static_cast<int>(kRsTileN);
  const int forced = forced_tile_n();
  if (forced == kPingpongTileN || forced == 256 || (forced == 192 && dtype != Element::kFP8E4M3)) return forced;
  const int tile_n = tile_n_above_one_row(M, N, K, sms, dtype, kMaxTailSplits, /*split_192_allowed=*/true,
                                          /*wide_allowed=*/rows_per_rank >= M);
  return tile_n == 256 && rowwise_rs_pingpong_takes(dtype, row_scales, K) ? static_cast<int>(kPingpongTileN) : tile_n;
}

// Whether a reduce-scatter's launch of tiles `tile_n` wide runs one-CTA clusters (the instantiation of
// problems of one tile row) rather than the ping-pong schedule's 2 x 1: kOneRowTileN where the rows a
// rank are an odd number of tile rows.
inline bool reduce_scatter_one_cta_clusters(int tile_n, int64_t rows_per_rank) {
  return tile_n == kOneRowTileN && reduce_scatter_one_cta(rows_per_rank);
}

// Where rows of one rank sit in the staging buffer and in the inbox, from the start of that rank's
// slot: through the epilogue the partial sums are row-major like the product; through fixup() each
// 128 x tile_n tile is a slot of its own (reduce_scatter_tiles.h).
struct StagedLayout {
  bool epilogue = false;
  int64_t N = 0, tile_n = kRsTileN, tiles_n = 0;

  StagedLayout(bool reduce_in_epilogue, int64_t n, int64_t tile_width = kRsTileN)
      : epilogue(reduce_in_epilogue), N(n), tile_n(tile_width), tiles_n(tiles_along(n, tile_width)) {}

  // A reduce-scatter's tiles along N (the last one partial where they do not divide).
  static int64_t tiles_along(int64_t n, int64_t tile_width = kRsTileN) { return (n + tile_width - 1) / tile_width; }

  size_t bytes_before(int64_t row) const {
    if (epilogue) return static_cast<size_t>(row * N) * sizeof(uint16_t);  // bf16 or fp16
    return static_cast<size_t>(row / kTileRows * tiles_n) * static_cast<size_t>(kTileRows * tile_n) * sizeof(uint16_t);
  }
  // What the kernel's staged counter of a chunk reaches once all its tiles are staged.
  uint32_t count(ReduceScatterTiles const& rs, int chunk) const {
    return rs.tiles_in_chunk(chunk) * staged_count_per_tile(epilogue);
  }
};

// A rank's rows cut into `chunks` bands of whole 2 x 1 clusters (a band of tiles stays within a chunk):
// `used` chunks of `rows` rows each, the last one shorter where they do not divide (an odd number of
// tile rows, in one-CTA clusters, ends a rank's last chunk).
struct RowChunks {
  int64_t rows = 0;
  int used = 0;

  RowChunks(int64_t rows_per_rank, int chunks)
      : rows((rows_per_rank / chunks + kClusterRows - 1) / kClusterRows * kClusterRows),
        used(static_cast<int>((rows_per_rank + rows - 1) / rows)) {}

  int64_t begin(int j) const { return j * rows; }
  int64_t end(int j, int64_t rows_per_rank) const { return std::min<int64_t>(rows_per_rank, (j + 1) * rows); }
};

}  // namespace asynctp::kernels::fused
