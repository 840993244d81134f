// Internal: where an all-gather rank's rows [begin, end) of M fall among the kernel's 128-row tiles.
// Host code only: the op (algo/fused_all_gather_matmul.cc) and the tile choice (fused_gemm.cc) ask it.
#pragma once

#include <cstdint>

#include "kernels/fused/tile_shape.h"

namespace asynctp::kernels::fused {

// Whether a tile holds both this rank's rows and a neighbour's: then it reads all its rows from the
// gathered buffer, and this rank's own rows are copied there first.
inline bool shard_straddles_tiles(int64_t begin, int64_t end, int64_t M) {
  return begin % kTileRows != 0 || (end % kTileRows != 0 && end != M);
}

}  // namespace asynctp::kernels::fused
