// Internal, device side of chunk_flags.h: a warp waits until the rows of a tile have arrived.
#pragma once

#include <cutlass/cutlass.h>

#include "kernels/fused/chunk_flags.h"
#include "kernels/signal.cuh"

namespace asynctp::kernels::fused {

// Waits until every chunk that holds a row of [row0, row1) has landed: an acquire load of each chunk's
// flag, bounded by the communicator's timeout, then `fence.proxy.async`, so that TMA loads issued after
// it (the async proxy) read what the flags announced. Every lane of the warp waits (the loads
// coalesce) and fences, so whichever lane goes on to read or issue loads has itself acquired the flags.
CUTLASS_DEVICE void wait_for_chunk_rows(ChunkFlags const& c, int32_t row0, int32_t row1) {
  const uint32_t expected = *c.epoch;
  for (int32_t r = row0; r < row1;) {
    const int32_t rank = r / c.rows_per_rank;
    const int32_t rank_row0 = rank * c.rows_per_rank;
    const int32_t chunk = (r - rank_row0) / c.rows_per_chunk;
    const int32_t index = rank * c.flag_stride + chunk;
    wait_flag_sys</*kPrint=*/false>(c.flags + index, expected, rank, c.pad_index + index, c.wait);
    r = min(rank_row0 + (chunk + 1) * c.rows_per_chunk, rank_row0 + c.rows_per_rank);
  }
  asm volatile("fence.proxy.async.global;" ::: "memory");
  __syncwarp();
}

}  // namespace asynctp::kernels::fused
