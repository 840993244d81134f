// Internal, device side of done_signal.h: a consumer warp with no more work says so, and the last of
// the grid's consumer warps raises this rank's done flag at every peer.
#pragma once

#include <cutlass/cutlass.h>

#include "kernels/fused/done_signal.h"
#include "kernels/fused/chunk_slots.h"
#include "kernels/fused/reduce_scatter_tiles.h"
#include "kernels/fused/tail_split.h"
#include "kernels/signal.cuh"

namespace asynctp::kernels::fused {

// A consumer warp's reads of the inbox (fixup) are complete and their values used. `rs` is the call's
// reduce-scatter (its pushed counts, its epoch).
CUTLASS_DEVICE void signal_done(DoneSignal const& done, ReduceScatterTiles const& rs) {
#if defined(__CUDA_ARCH__)
  __syncwarp();
  if (threadIdx.x % 32 != 0) return;
  const uint32_t warps = gridDim.x * gridDim.y * gridDim.z * static_cast<uint32_t>(kConsumerThreads / 32);
  uint32_t before;
  asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(before) : "l"(done.finished) : "memory");
  if (before + 1 != warps) return;
  // Pushed from the kernel: every own tile has seen its chunk's count whole, so the peer has added
  // its last; zeroed before the release below, the counts start from zero in the peer's next call,
  // which pushes only once it has seen this done.
  if (rs.pushed != nullptr) {
    for (int j = 0; j < kChunkSlots; ++j) rs.pushed[j] = 0;
  }
  const uint32_t epoch = rs.begin_epoch != 0 ? rs.begin_epoch : *done.epoch;
  for (int p = 0; p < done.peers; ++p) st_release_sys(done.flag[p], epoch);
  // Every warp has counted: zero for the next launch, which may start its epoch without a kernel
  // before it (reduce_scatter_tiles.h, begin_epoch) and so finds the count as this one leaves it.
  *done.finished = 0;
#endif
}

}  // namespace asynctp::kernels::fused
