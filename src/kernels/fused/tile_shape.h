// Internal: the fused GEMM's tile shape, as the host and the device both count with it.
// The kernel's CUTLASS tile shape is built from these (fused_gemm_kernel.cuh, which asserts they agree).
#pragma once

#include <cstdint>

namespace asynctp::kernels::fused {

// Rows of A per output tile: a tile whose rows come from two ranks waits for both.
constexpr int64_t kTileRows = 128;
// Rows of A per cluster of CTAs (two tiles along M share B's loads): the scheduler's unit of order.
constexpr int64_t kClusterRows = 2 * kTileRows;
// A problem of one tile row (M <= kTileRows) runs in one-CTA clusters of tiles this wide: a 2x1 cluster
// would leave its second CTA without rows, and 128-wide tiles give twice the units of work to spread
// over the SMs (fused_gemm_instances.h). So does a reduce-scatter's of an odd number of tile rows a
// rank, where a 2x1 cluster would hold two ranks' rows.
constexpr int kOneRowTileN = 128;
// An all-gather's problem of a few rounds of tiles runs tiles this wide in 2 x 1 clusters under
// CUTLASS's ping-pong schedule (pingpong_takes); at one tile row, kOneRowTileN's one-CTA clusters take
// the same width.
constexpr int kPingpongTileN = 128;
// fp8's all-gather with row-wise scales at K of kFp8PingpongBelowK and more runs tiles this wide in the
// ping-pong schedule where they fill their rounds (pingpong_192_takes): its epilogue is hidden behind the
// other warpgroup's mainloop, and it reads a quarter less from L2 than 128-wide tiles do.
constexpr int kPingpongWideTileN = 192;
// The widest tiles, 16-bit only: 128 x 320 (two 64 x 160 WGMMAs a warpgroup, three mainloop stages),
// where they take fewer rounds of tiles than 192 or 256 would (pick_tile_n), as at 1024 x 5120: 64
// cluster tiles, one round on 66 clusters, against 80 at 256 wide.
constexpr int kWideTileN = 320;
// Depth of a tile along K (one step of the mainloop) in bytes: a row of it is TMA's widest swizzle,
// so a 16-bit tile is 64 elements deep and an fp8 one 128.
constexpr int64_t kTileKBytes = 128;
// The depth in elements of 16 bits (the tile widths a 16-bit problem chooses between: pick_tile_n).
constexpr int64_t kTileK = kTileKBytes / 2;
// A reduce-scatter's tiles are this wide where they reduce in the epilogue, and in fp8; elsewhere 192
// or this (reduce_scatter_tile_n in staged_layout.h), alike on every rank.
constexpr int64_t kRsTileN = 256;

}  // namespace asynctp::kernels::fused
