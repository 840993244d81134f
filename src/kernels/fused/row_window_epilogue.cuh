// A CUTLASS epilogue whose output holds only rows [row0, row0 + rows) of the product: the fused
// reduce-scatter's output is this rank's rows (through fixup(); reduce_scatter_tiles.h), the
// all-gather's all of them (row0 = 0).
//
// RowWindowEpilogue<Base> builds Base's descriptors for those rows alone and hands Base each tile's
// row coordinate relative to row0, and always the whole tile to store: the subtile index the kernel
// passes (the scheduler's reduction_subtile_idx) is -1 for every tile that reaches this epilogue, and
// left unread it stays out of the registers the consumers hold across the mainloop. A descriptor that
// starts before its buffer, so as to be indexed by the product's rows, is what the kernel used before;
// the same trick on the reduce-scatter's inbox faulted on TMA loads (docs/design/fused_matmul_reduce_scatter.md), so
// no descriptor starts outside its buffer.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>

#include "kernels/fused/fused_gemm.h"

namespace asynctp::kernels::fused {

template <class Base>
class RowWindowEpilogue : public Base {
 public:
  static constexpr int kTileM = static_cast<int>(kTileRows);

  struct Arguments : Base::Arguments {
    int32_t row0 = 0;  // a multiple of the tile's rows
    int32_t rows = 0;  // 0: to the product's last row
  };

  struct Params : Base::Params {
    int32_t first_tile = 0;  // row0 in tiles
    int32_t rows = 0;
  };

  template <class ProblemShape>
  static Params to_underlying_arguments(ProblemShape const& problem_shape, Arguments const& args, void* workspace) {
    Params p;
    p.rows = args.rows > 0 ? args.rows : static_cast<int32_t>(cute::get<0>(problem_shape)) - args.row0;
    p.first_tile = args.row0 / kTileM;
    ProblemShape window = problem_shape;
    cute::get<0>(window) = p.rows;
    static_cast<typename Base::Params&>(p) = Base::to_underlying_arguments(window, args, workspace);
    return p;
  }

  template <class ProblemShape>
  static bool can_implement(ProblemShape const& problem_shape, Arguments const& args) {
    return args.row0 % kTileM == 0 && args.row0 >= 0 && Base::can_implement(problem_shape, args);
  }

  CUTLASS_DEVICE RowWindowEpilogue(Params const& params, typename Base::TensorStorage& shared_tensors)
      : Base(params, shared_tensors), first_tile_(params.first_tile), rows_(params.rows) {}

  template <class ProblemShapeMNKL, class TileShapeMNK, class TileCoordMNKL, class TiledMma>
  CUTLASS_DEVICE auto load(typename Base::LoadPipeline load_pipeline, typename Base::LoadPipelineState state,
                           ProblemShapeMNKL problem_shape, TileShapeMNK tile_shape, TileCoordMNKL tile_coord,
                           TiledMma tiled_mma, int thread_idx, typename Base::TensorStorage& shared_tensors,
                           int /*subtile_idx*/ = -1) {
    return Base::load(load_pipeline, state, window(problem_shape), tile_shape, window_coord(tile_coord), tiled_mma,
                      thread_idx, shared_tensors, -1);
  }

  template <class ProblemShapeMNKL, class TileShapeMNK, class TileCoordMNKL, class AccEngine, class AccLayout,
            class TiledMma>
  CUTLASS_DEVICE auto store(typename Base::LoadPipeline load_pipeline, typename Base::LoadPipelineState load_state,
                            typename Base::StorePipeline store_pipeline, typename Base::StorePipelineState store_state,
                            ProblemShapeMNKL problem_shape, TileShapeMNK tile_shape, TileCoordMNKL tile_coord,
                            cute::Tensor<AccEngine, AccLayout> accumulators, TiledMma tiled_mma, int thread_idx,
                            typename Base::TensorStorage& shared_tensors, int /*subtile_idx*/ = -1) {
    return Base::store(load_pipeline, load_state, store_pipeline, store_state, window(problem_shape), tile_shape,
                       window_coord(tile_coord), accumulators, tiled_mma, thread_idx, shared_tensors, -1);
  }

 private:
  template <class ProblemShapeMNKL>
  CUTLASS_DEVICE ProblemShapeMNKL window(ProblemShapeMNKL shape) const {
    cute::get<0>(shape) = rows_;
    return shape;
  }
  template <class TileCoordMNKL>
  CUTLASS_DEVICE TileCoordMNKL window_coord(TileCoordMNKL coord) const {
    cute::get<0>(coord) -= first_tile_;
    return coord;
  }

  int32_t first_tile_;
  int32_t rows_;
};

}  // namespace asynctp::kernels::fused
