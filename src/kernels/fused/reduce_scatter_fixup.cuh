// Internal, device side of reduce_scatter_tiles.h, once a tile's accumulators are whole: they are
// scaled by the rank's partial_scale, or its row-wise scales, where it has them, and given the bias
// where there is one; then a tile of a peer's rows is staged (rounded to the output type, two values a
// word) for the peer to pull, and a tile of this rank's own rows gets every peer's staged copy added.
// Thread `thread` of `threads` owns the 16-byte groups [group * threads + thread] of a tile's slot,
// eight output elements per group.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/fast_math.h>

#include "kernels/fused/accumulator_places.cuh"
#include "kernels/fused/reduce_scatter_tiles.h"
#include "kernels/fused/tile_trace.h"
#include "kernels/signal.cuh"

namespace asynctp::kernels::fused {

template <class Element>
CUTLASS_DEVICE uint32_t pack_pair(float lo, float hi) {
  return static_cast<uint32_t>(Element(lo).raw()) | (static_cast<uint32_t>(Element(hi).raw()) << 16);
}

template <class Element>
CUTLASS_DEVICE void unpack_pair(uint32_t word, float& lo, float& hi) {
  lo = static_cast<float>(Element::bitcast(static_cast<uint16_t>(word & 0xFFFFu)));
  hi = static_cast<float>(Element::bitcast(static_cast<uint16_t>(word >> 16)));
}

// Multiplies each value of the tile whose first row is `row0`, `n_idx` tiles along N, by its row's and
// its column's scale (`cols` of them, on an 8-byte boundary: fp8's N is a multiple of 16, the scaled
// ops' scales 16-byte aligned). Each thread reads its 2 rows' scales and its columns' (a quarter of
// the tile's, in pairs) through L1 (accumulator_places.cuh).
template <class FrgTensorC>
CUTLASS_DEVICE void scale_rows_and_columns(const float* row_scales, const float* col_scales, int32_t row0, int32_t n_idx,
                                           int32_t cols, FrgTensorC& accumulators, uint32_t threads) {
  constexpr int kMmaM = decltype(cute::size<1>(accumulators))::value;
  float top[kMmaM], bottom[kMmaM];  // the thread's 2 rows' scales in each MMA along M
  CUTLASS_PRAGMA_UNROLL
  for (int mm = 0; mm < kMmaM; ++mm) {
    const int32_t row = row0 + accumulator_row(threadIdx.x, threads, mm);
    top[mm] = __ldg(row_scales + row), bottom[mm] = __ldg(row_scales + row + 8);
  }
  const float2* pairs = reinterpret_cast<const float2*>(col_scales);
  scale_by_rows_and_columns(threadIdx.x, accumulators, top, bottom, n_idx, cols, [&](int32_t pair) { return __ldg(pairs + pair); });
}

// Adds its column's bias (`cols` values of Element, two a word) to each value of the tile `n_idx`
// tiles along N.
template <class Element, class FrgTensorC>
CUTLASS_DEVICE void add_column_bias(const void* bias, int32_t n_idx, int32_t cols, FrgTensorC& accumulators) {
  const uint32_t* pairs = static_cast<const uint32_t*>(bias);
  for_each_column_pair(threadIdx.x, n_idx, cols, accumulators, [&](int mm, int nn, int g, int32_t pair) {
    float lo, hi;
    unpack_pair<Element>(__ldg(pairs + pair), lo, hi);
    accumulators(cute::make_coord(cute::make_coord(0, 0, g), mm, nn)) += lo;
    accumulators(cute::make_coord(cute::make_coord(1, 0, g), mm, nn)) += hi;
    accumulators(cute::make_coord(cute::make_coord(0, 1, g), mm, nn)) += lo;
    accumulators(cute::make_coord(cute::make_coord(1, 1, g), mm, nn)) += hi;
  });
}

// The row-wise scaling of a tile whose first row is `row0`, `n_idx` tiles along N, read through L1
// (scale_rows_and_columns): the cooperative kernel's fixup() takes it.
struct ScaleRowsThroughL1 {
  ReduceScatterTiles const& rs;
  uint32_t threads;
  template <class FrgTensorC>
  CUTLASS_DEVICE void operator()(int32_t row0, int32_t n_idx, FrgTensorC& accumulators) const {
    scale_rows_and_columns(rs.row_scales, rs.col_scales, row0, n_idx, rs.cols, accumulators, threads);
  }
};

// The scheduler's whole tile `work` (M_idx, N_idx; tiles of `tile_m` rows): staged (a peer's rows),
// with staged_count() tiles to add to its chunk's count, or an own tile, which waits for each peer's
// chunk (marking kTraceWaitDone through `mark`) and adds it. Only the scaling and the bias where the
// epilogue does the rest (reduce_in_epilogue). kScaled: the scaled op's (fp8) instantiations, the only
// ones with scales or a bias; the others compile none of that, which their consumers' registers have
// no room for. Row-wise, `scale_rows(row0, n_idx, accumulators)` scales the tile (ScaleRowsThroughL1,
// or the ping-pong epilogue's from shared memory).
template <class Element, bool kScaled, class Work, class FrgTensorC, class Mark, class ScaleRows>
CUTLASS_DEVICE void reduce_scatter_fixup(ReduceScatterTiles const& rs, int32_t tile_m, cutlass::FastDivmod const& rank_rows_div,
                                         cutlass::FastDivmod const& chunk_rows_div, Work const& work,
                                         FrgTensorC& accumulators, uint32_t thread, uint32_t threads, Mark mark,
                                         ScaleRows&& scale_rows) {
#if defined(__CUDA_ARCH__)
  if (rs.rank < 0) return;
  const int32_t row0 = work.M_idx * tile_m;
  // Before the epilogue's way too, which stages and adds what fixup() hands it.
  if constexpr (kScaled) {
    if (rs.partial_scale != nullptr) {
      const float s = *rs.partial_scale;
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < decltype(cute::size(accumulators))::value; ++i) accumulators(i) *= s;
    } else if (rs.row_scales != nullptr) {
      scale_rows(row0, work.N_idx, accumulators);
    }
    if (rs.bias != nullptr) add_column_bias<Element>(rs.bias, work.N_idx, rs.cols, accumulators);
  }
  if (rs.reduce_in_epilogue) return;
  constexpr int kWords = decltype(cute::size(accumulators))::value / 2;
  const int32_t owner = rs.owner_of(row0, rank_rows_div);
  const int32_t tile = (row0 - owner * rs.rows_per_rank) / tile_m * rs.tiles_n + work.N_idx;
  const int32_t tiles_per_rank = rs.rows_per_rank / tile_m * rs.tiles_n;
  const int32_t chunk = rs.chunk_of(row0, rank_rows_div, chunk_rows_div);
  const size_t slot_words = static_cast<size_t>(kWords) * threads;
  static_assert(kWords % 4 == 0, "a thread's words go in 16-byte groups");
  if (work.staged()) {
    uint4* slot = reinterpret_cast<uint4*>(rs.staging + (static_cast<size_t>(owner) * tiles_per_rank + tile) * slot_words) + thread;
    CUTLASS_PRAGMA_UNROLL
    for (int g = 0; g < kWords / 4; ++g) {
      const int e = 8 * g;
      slot[g * threads] = make_uint4(pack_pair<Element>(accumulators(e), accumulators(e + 1)),
                                     pack_pair<Element>(accumulators(e + 2), accumulators(e + 3)),
                                     pack_pair<Element>(accumulators(e + 4), accumulators(e + 5)),
                                     pack_pair<Element>(accumulators(e + 6), accumulators(e + 7)));
    }
    const uint32_t count = work.staged_count();  // the scheduler's visit()
    if (count == 0) return;
    // One count per warp (staged_count_per_tile): __syncwarp orders the lanes' stores before lane 0's
    // release, which the copy engine's wait (a stream memory operation on this GPU) then sees.
    __syncwarp();
    if (threadIdx.x % 32 == 0) rs.add_staged(row0, count);
    return;
  }
  // No peers at one rank (asynctp-bench times the kernel so), and then no epoch either.
  const uint32_t expected = rs.world > 1 ? rs.arrival_epoch() : 0u;
  for (int32_t q = 0; q < rs.world; ++q) {
    if (q == rs.rank) continue;
    const int32_t index = q * rs.flag_stride + chunk;
    wait_flag_sys</*kPrint=*/false>(rs.arrived + index, expected, q, rs.pad_index + index, rs.wait);
    mark(kTraceWaitDone);
    const uint4* theirs = reinterpret_cast<const uint4*>(rs.inbox + (static_cast<size_t>(q) * tiles_per_rank + tile) * slot_words) + thread;
    CUTLASS_PRAGMA_UNROLL
    for (int g = 0; g < kWords / 4; ++g) {
      const uint4 v = theirs[g * threads];
      const uint32_t words[4] = {v.x, v.y, v.z, v.w};
      CUTLASS_PRAGMA_UNROLL
      for (int k = 0; k < 4; ++k) {
        float lo, hi;
        unpack_pair<Element>(words[k], lo, hi);
        accumulators(8 * g + 2 * k) += lo;
        accumulators(8 * g + 2 * k + 1) += hi;
      }
    }
  }
#endif
}

}  // namespace asynctp::kernels::fused
