// Internal, device side of tile_trace.h: where a unit's record is, and the times the scheduler writes
// in it. Each call site tests the trace pointer (null: the call does not trace).
#pragma once

#include <cute/arch/cluster_sm90.hpp>
#include <cutlass/cutlass.h>

#include "kernels/fused/tile_trace.h"
#include "kernels/signal.cuh"

namespace asynctp::kernels::fused {

// The record of work unit `unit` and this CTA of its cluster.
CUTLASS_DEVICE uint64_t* trace_record(uint64_t* trace, int32_t unit) {
  const uint32_t cta = cute::block_rank_in_cluster();
  return trace + (static_cast<size_t>(unit) * kTraceCtasPerCluster + cta) * kTraceWords;
}

// Now, in word `word` of the unit's record.
CUTLASS_DEVICE void trace_now(uint64_t* trace, int32_t unit, int word) {
#if defined(__CUDA_ARCH__)
  trace_record(trace, unit)[word] = global_timer_ns();
#endif
}

// A tile's coordinates and the end of its epilogue (its split and whether it was staged, for a
// reduce-scatter's tile).
template <class WorkTileInfo>
CUTLASS_DEVICE void trace_epilogue_done(uint64_t* trace, WorkTileInfo const& work) {
#if defined(__CUDA_ARCH__)
  uint64_t* r = trace_record(trace, work.unit);
  r[kTraceTile] = static_cast<uint64_t>(work.M_idx) << 32 | static_cast<uint32_t>(work.N_idx);
  r[kTraceUnit] = static_cast<uint64_t>(blockIdx.z) << 32 | static_cast<uint64_t>(work.split()) << 16 |
                  static_cast<uint64_t>(work.splits()) << 1 | (work.staged() ? 1u : 0u);
  r[kTraceEpilogueDone] = global_timer_ns();
#endif
}

}  // namespace asynctp::kernels::fused
