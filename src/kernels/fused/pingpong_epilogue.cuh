// The epilogue of the ping-pong schedule's instantiations (but fp8's with row-wise scales, which the
// reduce-scatter does not take), which run the all-gather's and the reduce-scatter's problems of a few
// rounds of tiles (pingpong_takes).
//
// CUTLASS's ping-pong kernel has no fixup() step between a tile's mainloop and its epilogue, so the
// reduce-scatter's part of it (reduce_scatter_fixup.cuh) runs here, at the start of the tile's
// epilogue, on the warpgroup's own 128 x 128 tile: a tile of a peer's rows is staged for the copy
// engine and not stored (its rows are not in the output), and a tile of this rank's own rows gets
// every peer's staged copy added before RowWindowEpilogue<Base> stores it. The staging slot of a tile
// is laid out by the thread that holds each value (128 threads here, 256 in the cooperative kernel);
// every rank of a call runs the same schedule (reduce_scatter_tile_n), so writer and reader agree.
//
// A staged tile skips Base's store and leaves the pipeline states where they were: its stores would
// use none of Base's buffers, and the kernel's store_tail() after each epilogue waits for every TMA
// store of the warpgroup anyway. Tiles are never split in this schedule, so each tile counts itself
// for its chunk, its four warps adding staged_count_per_tile between them.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/fast_math.h>

#include "kernels/fused/reduce_scatter_fixup.cuh"
#include "kernels/fused/reduce_scatter_tiles.h"
#include "kernels/fused/row_window_epilogue.cuh"

namespace asynctp::kernels::fused {

// kScaled: the scaled op's (fp8) instantiation, whose reduce-scatter scales its tiles and adds a bias.
template <class Base, bool kScaled>
class PingpongEpilogue : public RowWindowEpilogue<Base> {
  using Window = RowWindowEpilogue<Base>;

 public:
  struct Arguments : Window::Arguments {
    ReduceScatterTiles rs;  // rs.rank < 0: an all-gather's tiles, stored as they are
  };

  struct Params : Window::Params {
    ReduceScatterTiles rs;
    cutlass::FastDivmod rank_rows_div, chunk_rows_div;
  };

  template <class ProblemShape>
  static Params to_underlying_arguments(ProblemShape const& problem_shape, Arguments const& args, void* workspace) {
    Params p;
    static_cast<typename Window::Params&>(p) = Window::to_underlying_arguments(problem_shape, args, workspace);
    p.rs = args.rs;
    if (args.rs.rank >= 0) {
      p.rank_rows_div = cutlass::FastDivmod(args.rs.rows_per_rank);
      p.chunk_rows_div = cutlass::FastDivmod(args.rs.rows_per_chunk);
    }
    return p;
  }

  CUTLASS_DEVICE PingpongEpilogue(Params const& params, typename Base::TensorStorage& shared_tensors)
      : Window(params, shared_tensors), params_(params) {}

  template <class ProblemShapeMNKL, class TileShapeMNK, class TileCoordMNKL, class AccEngine, class AccLayout,
            class TiledMma>
  CUTLASS_DEVICE auto store(typename Base::LoadPipeline load_pipeline, typename Base::LoadPipelineState load_state,
                            typename Base::StorePipeline store_pipeline, typename Base::StorePipelineState store_state,
                            ProblemShapeMNKL problem_shape, TileShapeMNK tile_shape, TileCoordMNKL tile_coord,
                            cute::Tensor<AccEngine, AccLayout> accumulators, TiledMma tiled_mma, int thread_idx,
                            typename Base::TensorStorage& shared_tensors, int subtile_idx = -1) {
    if (params_.rs.rank >= 0) {
      const int32_t m = static_cast<int32_t>(cute::get<0>(tile_coord)), n = static_cast<int32_t>(cute::get<1>(tile_coord));
      // Each way inlined for its kind of tile alone: one copy for both held the warpgroup past its
      // registers (ptxas spilled).
      if (params_.rs.is_staged(m * Window::kTileM, params_.rank_rows_div)) {
        reduce(Tile</*kStaged=*/true>{m, n}, accumulators, thread_idx);
        return cute::make_tuple(load_state, store_state);
      }
      reduce(Tile</*kStaged=*/false>{m, n}, accumulators, thread_idx);
    }
    return Window::store(load_pipeline, load_state, store_pipeline, store_state, problem_shape, tile_shape, tile_coord,
                         accumulators, tiled_mma, thread_idx, shared_tensors, subtile_idx);
  }

 private:
  // What reduce_scatter_fixup() asks of a tile: where it is, whether it is staged, and what each warp
  // adds to its chunk's count.
  template <bool kStaged>
  struct Tile {
    int32_t M_idx, N_idx;
    CUTLASS_DEVICE static constexpr bool staged() { return kStaged; }
    CUTLASS_DEVICE static constexpr uint32_t staged_count() {
      return staged_count_per_tile(false) / (cutlass::NumThreadsPerWarpGroup / cutlass::NumThreadsPerWarp);
    }
  };
  static_assert(staged_count_per_tile(false) % (cutlass::NumThreadsPerWarpGroup / cutlass::NumThreadsPerWarp) == 0,
                "a tile's count splits evenly over the warpgroup's warps");

  template <class TileKind, class Accumulators>
  CUTLASS_DEVICE void reduce(TileKind const& tile, Accumulators& accumulators, int thread_idx) const {
    reduce_scatter_fixup<typename Base::ElementD, kScaled>(params_.rs, Window::kTileM, params_.rank_rows_div,
                                                           params_.chunk_rows_div, tile, accumulators,
                                                           static_cast<uint32_t>(thread_idx),
                                                           cutlass::NumThreadsPerWarpGroup, [](int) {});
  }

  Params const& params_;
};

}  // namespace asynctp::kernels::fused
