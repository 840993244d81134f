// How a staged reduce-scatter tile's release (async_input_scheduler.cuh, WorkTileInfo::staged_release)
// reaches the epilogue. CUTLASS's kernels hand the mainloop and the epilogue a tile's (m, n, k, l)
// coordinates and nothing else of the scheduler's work tile (the ping-pong kernel not even the
// reduction_subtile_idx the cooperative one passes). The batch coordinate l is always 0 here (one
// batch), so the scheduler carries release + 1 in it (0: none), and the mainloop and the epilogue take
// it out before CUTLASS's code sees the coordinate.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>

namespace asynctp::kernels::fused {

// The work tile's batch index for `release` (-1: none).
CUTLASS_HOST_DEVICE constexpr int32_t batch_index_for(int32_t release) { return release + 1; }

// `coord` with its batch coordinate back at 0, and the release it carried (-1: none).
template <class TileCoordMNKL>
CUTLASS_DEVICE TileCoordMNKL take_release(TileCoordMNKL coord, int32_t& release) {
  release = static_cast<int32_t>(cute::get<3>(coord)) - 1;
  cute::get<3>(coord) = 0;
  return coord;
}

}  // namespace asynctp::kernels::fused
