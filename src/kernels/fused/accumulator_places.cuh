// Internal: where the values of a thread's WGMMA accumulators lie in its tile, for the steps that
// scale them or add to them by row and column (reduce_scatter_fixup.cuh, row_scale_epilogue.cuh).
//
// The accumulators are a WGMMA D fragment, ((2, 2, N / 8), MMA_M, MMA_N) a thread: in an 8-column
// group v2, a warp's lane holds columns 2 * (lane % 4) + v0 of rows lane / 4 + 8 * v1 of the warp's 16
// (PTX ISA, wgmma's D fragments), the `threads` / 128 warpgroups of the tiled MMA hold 64-row slices of
// the tile in turn, and MMA_M and MMA_N repeat that over the tile. A thread's place in the tiled MMA is
// threadIdx.x % threads, as CUTLASS's kernels take it: in the cooperative kernel the first consumer
// warpgroup (threads 128-255) holds the second 64-row slice. Each helper takes the thread's index
// (`tid`, threadIdx.x or what opaque_thread_index gives).
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>

namespace asynctp::kernels::fused {

// threadIdx.x, read where it is used: the compiler cannot hoist what is derived from it out of the
// kernel's loop over tiles, where the addresses would take registers for the whole mainloop.
CUTLASS_DEVICE uint32_t opaque_thread_index() {
  uint32_t tid;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(tid));
  return tid;
}

template <class FrgTensorC>
CUTLASS_HOST_DEVICE constexpr void check_wgmma_fragment() {
  using Values = decltype(cute::shape<0>(FrgTensorC{}));
  static_assert(cute::rank(Values{}) == 3 && cute::size<0>(Values{}) == 2 && cute::size<1>(Values{}) == 2,
                "a WGMMA accumulator fragment: ((2, 2, N / 8), MMA_M, MMA_N)");
}

// The tile row of the thread's upper value (v1 = 0) in MMA `mm` along M; the lower one is 8 rows on.
CUTLASS_DEVICE int32_t accumulator_row(uint32_t tid, uint32_t threads, int mm) {
  const uint32_t mma_thread = tid % threads;
  const int32_t warpgroups = static_cast<int32_t>(threads / cutlass::NumThreadsPerWarpGroup);
  const int32_t warpgroup = static_cast<int32_t>(mma_thread / cutlass::NumThreadsPerWarpGroup);
  const int32_t in_group = static_cast<int32_t>(mma_thread % cutlass::NumThreadsPerWarpGroup);
  return (mm * warpgroups + warpgroup) * 64 + in_group / 32 * 16 + in_group % 32 / 4;
}

// Calls f(mm, nn, g, pair) for each 8-column group g of each MMA (mm, nn) of a thread's accumulators
// of the tile `n_idx` tiles along N, `pair` the index of the column pair (2 * pair, 2 * pair + 1) the
// thread holds there, counted from column 0 of the product. `cols` is even; columns past it (zeros)
// get the last pair's index. Each pair's index is clamped, not tested: with a test against `cols` on
// each pair the reduce-scatter's consumers went past their registers, and ptxas spilled.
template <class FrgTensorC, class F>
CUTLASS_DEVICE void for_each_column_pair(uint32_t tid, int32_t n_idx, int32_t cols, FrgTensorC const& accumulators, F&& f) {
  check_wgmma_fragment<FrgTensorC>();
  constexpr int kGroups = cute::size<2>(decltype(cute::shape<0>(accumulators)){});  // 8-column groups of an MMA atom
  constexpr int kMmaM = decltype(cute::size<1>(accumulators))::value;
  constexpr int kMmaN = decltype(cute::size<2>(accumulators))::value;
  const int32_t col0 = n_idx * kMmaN * kGroups * 8;
  const int32_t col_in_group = 2 * static_cast<int32_t>(tid % 4);  // lane % 4: 128 divides threads
  const int32_t last_pair = cols / 2 - 1;
  CUTLASS_PRAGMA_UNROLL
  for (int mm = 0; mm < kMmaM; ++mm) {
    CUTLASS_PRAGMA_UNROLL
    for (int nn = 0; nn < kMmaN; ++nn) {
      CUTLASS_PRAGMA_UNROLL
      for (int g = 0; g < kGroups; ++g) f(mm, nn, g, min((col0 + (nn * kGroups + g) * 8 + col_in_group) / 2, last_pair));
    }
  }
}

// Multiplies each value by the product of its row's and its column's scale: `top[mm]` and
// `bottom[mm]` are the scales of the thread's two rows in MMA mm (accumulator_row and 8 rows on),
// `column_pair(pair)` a float2 of the pair's two column scales (for_each_column_pair's pairs).
template <class FrgTensorC, class ColumnPair>
CUTLASS_DEVICE void scale_by_rows_and_columns(uint32_t tid, FrgTensorC& accumulators, float const* top,
                                              float const* bottom, int32_t n_idx, int32_t cols, ColumnPair&& column_pair) {
  for_each_column_pair(tid, n_idx, cols, accumulators, [&](int mm, int nn, int g, int32_t pair) {
    const float2 c = column_pair(pair);
    accumulators(cute::make_coord(cute::make_coord(0, 0, g), mm, nn)) *= top[mm] * c.x;
    accumulators(cute::make_coord(cute::make_coord(1, 0, g), mm, nn)) *= top[mm] * c.y;
    accumulators(cute::make_coord(cute::make_coord(0, 1, g), mm, nn)) *= bottom[mm] * c.x;
    accumulators(cute::make_coord(cute::make_coord(1, 1, g), mm, nn)) *= bottom[mm] * c.y;
  });
}

}  // namespace asynctp::kernels::fused
