// Internal, device side of tail_split.h: a split tile's partial sums meet in its last split. Thread i
// of every split holds the same elements of the tile, so each thread hands over its own registers
// through its own counter, and no thread waits for another of its CTA. A tile's splits are in one
// round of the persistent grid, so each is resident or will be once a cluster that does not wait ends;
// the wait is bounded all the same. The sum goes in split order: the same bits on every run.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>

#include "common/device_fault.h"
#include "kernels/fused/tail_split.h"
#include "kernels/fused/tile_trace.h"
#include "kernels/signal.cuh"
#include "kernels/wait_context.h"

namespace asynctp::kernels::fused {

// The scheduler's unit `work`, split split() of splits() of a tail tile whose row of the workspace is
// slot_of() (its counters at counters[row * kConsumerThreads + thread], its partial sums after
// `partials`): every split but the last stores its sums and counts; the last waits for the others
// (bounded by `wait`), marks kTraceWaitDone through `mark`, and adds them in split order. Returns
// whether `accumulators` now hold the whole tile (false: a split that handed its sums over).
template <class Work, class SlotOf, class FrgTensorC, class Mark>
CUTLASS_DEVICE bool sum_tail_splits(Work const& work, SlotOf slot_of, FrgTensorC& accumulators, uint32_t* counters,
                                    float* partials, WaitContext const& wait, uint32_t thread, uint32_t threads,
                                    Mark mark) {
#if defined(__CUDA_ARCH__)
  const int32_t split = work.split(), splits = work.splits();
  if (splits <= 1) return true;
  constexpr int kElements = decltype(cute::size(accumulators))::value;
  static_assert(kElements * kConsumerThreads <= kMaxTileElements, "a tile's partial sums outgrow their slot");
  static_assert(kElements % 4 == 0, "a thread's partial sums go in 16-byte groups");
  // A thread's sums move as 16-byte groups [group][thread] (coalesced): as single floats the last split
  // kept four 4-byte loads in flight (the consumers hold ~40 registers beside the accumulators), so it
  // made 32 round trips to L2 where it now makes 8.
  constexpr int kGroups = kElements / 4;
  const int32_t tail_slot = slot_of();
  uint32_t* counter = counters + static_cast<size_t>(tail_slot) * kConsumerThreads + thread;
  float4* slots = reinterpret_cast<float4*>(partials + static_cast<size_t>(tail_slot) * (splits - 1) * kMaxTileElements) + thread;
  constexpr size_t kSlotGroups = kMaxTileElements / 4;
  if (split + 1 < splits) {
    float4* mine = slots + static_cast<size_t>(split) * kSlotGroups;
    CUTLASS_PRAGMA_UNROLL
    for (int g = 0; g < kGroups; ++g) {
      mine[g * threads] = make_float4(accumulators(4 * g), accumulators(4 * g + 1), accumulators(4 * g + 2), accumulators(4 * g + 3));
    }
    asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(counter) : "memory");
    return false;
  }
  const uint32_t others = static_cast<uint32_t>(splits - 1);
  // Bounded like every wait in asynctp; a timeout here means a split never ran, which is a bug.
  wait_flag_sys</*kPrint=*/false>(counter, others, wait.rank, tail_slot, wait, asynctp::detail::FaultSite::kSplitReduction);
  mark(kTraceWaitDone);
  for (int j = 0; j < splits - 1; ++j) {
    const float4* theirs = slots + static_cast<size_t>(j) * kSlotGroups;
    CUTLASS_PRAGMA_UNROLL
    for (int g = 0; g < kGroups; ++g) {
      const float4 v = theirs[g * threads];
      accumulators(4 * g) += v.x;
      accumulators(4 * g + 1) += v.y;
      accumulators(4 * g + 2) += v.z;
      accumulators(4 * g + 3) += v.w;
    }
  }
  *counter = 0;  // ready for the next launch, which runs after this one ends
  return true;
#else
  return false;
#endif
}

}  // namespace asynctp::kernels::fused
