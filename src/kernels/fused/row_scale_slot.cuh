// Internal: a tile's row-wise fp8 scales in shared memory, for the epilogues that read them there
// (row_scale_epilogue.cuh, pingpong_epilogue.cuh). The producer warpgroup's epilogue warp copies a
// tile's row scales and its columns' into a slot a tile ahead of the consumers, so that no consumer
// waits on global memory between its mainloop and its stores; each epilogue hands its slots over
// through named barriers of its own.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>

#include "kernels/fused/accumulator_places.cuh"

namespace asynctp::kernels::fused {

template <int kTileM, int kTileN>
struct RowScaleSlot {
  static_assert(kTileM % 128 == 0 && kTileN % 128 == 0, "the epilogue warp copies the scales 16 bytes a lane, 32 lanes at a time");
  alignas(16) float rows[kTileM];
  alignas(16) float cols[kTileN];

  // The epilogue warp, lane `lane`: copies the scales of rows [row0, row0 + kTileM) of M and of
  // columns [col0, col0 + kTileN) of N, and waits for its copies. Straight from global to shared
  // memory (cp.async), 16 bytes a copy: the epilogue warp has 40 registers (setmaxnreg), too few to
  // hold the values on their way. Bytes past the last row or column are filled with zeros.
  CUTLASS_DEVICE void stage(const float* row_scales, const float* col_scales, int32_t row0, int32_t col0, int32_t M,
                            int32_t N, int lane) {
    CUTLASS_PRAGMA_UNROLL
    for (int i = lane; i < kTileM / 4; i += cutlass::NumThreadsPerWarp) copy_16_bytes_or_zeros(rows + 4 * i, row_scales, row0 + 4 * i, M);
    CUTLASS_PRAGMA_UNROLL
    for (int i = lane; i < kTileN / 4; i += cutlass::NumThreadsPerWarp) copy_16_bytes_or_zeros(cols + 4 * i, col_scales, col0 + 4 * i, N);
    asm volatile("cp.async.wait_all;" ::: "memory");
    __threadfence_block();  // the copies, now this thread's, before the arrival the consumers wait on
  }

  // A consumer thread (`tid` its index, of `threads` in the tiled MMA): multiplies each of its
  // accumulators of the slot's tile by its row's and its column's scale.
  template <class FrgTensorC>
  CUTLASS_DEVICE void scale(uint32_t tid, uint32_t threads, FrgTensorC& accumulators) const {
    constexpr int kMmaM = decltype(cute::size<1>(accumulators))::value;
    float top[kMmaM], bottom[kMmaM];
    CUTLASS_PRAGMA_UNROLL
    for (int mm = 0; mm < kMmaM; ++mm) {
      const int32_t row = accumulator_row(tid, threads, mm);
      top[mm] = rows[row], bottom[mm] = rows[row + 8];
    }
    const float2* pairs = reinterpret_cast<const float2*>(cols);
    scale_by_rows_and_columns(tid, accumulators, top, bottom, /*n_idx=*/0, kTileN, [&](int32_t pair) { return pairs[pair]; });
  }

 private:
  // Starts copying floats [at, at + 4) of `src`, of which there are `count`, to `dst` (16-byte aligned, as
  // are `src` and `at` a multiple of 4); those from `count` on are written as 0.
  CUTLASS_DEVICE static void copy_16_bytes_or_zeros(float* dst, const float* src, int32_t at, int32_t count) {
    const int32_t bytes = max(0, min(4, count - at)) * static_cast<int32_t>(sizeof(float));
    const float* from = bytes > 0 ? src + at : src;
    const uint32_t to = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(to), "l"(from), "r"(bytes) : "memory");
  }
};

}  // namespace asynctp::kernels::fused
