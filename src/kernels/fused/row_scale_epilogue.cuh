// The cooperative fp8 kernel's epilogue with row-wise scales: C[m, n] = row_scales[m] * acc[m, n] *
// col_scales[n] (+ bias[n], Base's).
//
// RowScaleEpilogue<Base> scales the accumulators in registers and hands them to Base, a tensor-wise
// epilogue with alpha = 1, which stores them in its usual subtiles. The scales come from shared
// memory (row_scale_slot.cuh), where the producer warpgroup's epilogue warp (idle in a kernel without
// a source C) puts them a tile ahead: its load(), which the kernel calls for every tile with an
// epilogue in the order the consumers store them, reads the tile's 128 row scales and its columns'
// into one of two slots, after the flags of the tile's rows (chunk_wait.cuh: an all-gather's row
// scales arrive with their rows). So no consumer waits on global memory between its mainloop and its
// stores: read there (by CUTLASS's visitor-tree broadcasts, in subtiles 16 wide, as 32 spilled), the
// scales cost the 128 x 256 kernel 2.7% more cycles than its tensor-wise form at 8192^3, and 1.2%
// read here (docs/performance.md).
//
// The slots are handed over through named barriers, two per slot: `full` (the epilogue warp arrives
// once it has written a slot, the consumers wait) and `empty` (the consumers arrive once they have
// read it, the epilogue warp waits before it writes the slot again, and once more for each slot in
// load_tail(), so that no barrier is left half-arrived).
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/cutlass.h>

#include "kernels/fused/accumulator_places.cuh"
#include "kernels/fused/chunk_flags.h"
#include "kernels/fused/chunk_wait.cuh"
#include "kernels/fused/row_scale_slot.cuh"

namespace asynctp::kernels::fused {

template <class Base>
class RowScaleEpilogue : public Base {
 public:
  using TileShape = typename Base::CtaTileMNK;
  static constexpr int kTileM = cute::size<0>(TileShape{});
  static constexpr int kTileN = cute::size<1>(TileShape{});

  struct Arguments : Base::Arguments {
    const float* row_scales = nullptr;  // M of them: an all-gather's, gathered with A's rows
    const float* col_scales = nullptr;  // N of them
    ChunkFlags chunks{};                // the rows' flags (chunks.flags null: every row is in place)
    int32_t local_begin = 0, local_end = 0;  // this rank's own rows, whose scales are there from the start
  };

  struct Params : Base::Params {
    const float* row_scales = nullptr;
    const float* col_scales = nullptr;
    ChunkFlags chunks{};
    int32_t local_begin = 0, local_end = 0;
  };

  using Slot = RowScaleSlot<kTileM, kTileN>;
  struct TensorStorage : Base::TensorStorage {
    Slot slots[2];
  };
  using PipelineStorage = typename Base::PipelineStorage;
  struct SharedStorage {
    TensorStorage tensors;
    PipelineStorage pipeline;
  };

  template <class ProblemShape>
  static Params to_underlying_arguments(ProblemShape const& problem_shape, Arguments const& args, void* workspace) {
    Params p;
    static_cast<typename Base::Params&>(p) = Base::to_underlying_arguments(problem_shape, args, workspace);
    p.row_scales = args.row_scales;
    p.col_scales = args.col_scales;
    p.chunks = args.chunks;
    p.local_begin = args.local_begin;
    p.local_end = args.local_end;
    return p;
  }

  CUTLASS_DEVICE RowScaleEpilogue(Params const& params, TensorStorage& shared_tensors)
      : Base(params, shared_tensors), params_(params) {}

  // The epilogue warp runs for the scales, whatever Base needs.
  CUTLASS_DEVICE bool is_producer_load_needed() const { return true; }

  template <class ProblemShapeMNKL, class TileShapeMNK, class TileCoordMNKL, class TiledMma>
  CUTLASS_DEVICE auto load(typename Base::LoadPipeline load_pipeline, typename Base::LoadPipelineState state,
                           ProblemShapeMNKL problem_shape, TileShapeMNK tile_shape, TileCoordMNKL tile_coord,
                           TiledMma tiled_mma, int thread_idx, TensorStorage& shared_tensors, int subtile_idx = -1) {
    static_assert(cute::size(TiledMma{}) == kConsumerThreads, "the cooperative kernel's two consumer warpgroups");
    const uint32_t slot = tiles_ & 1u;
    if (tiles_ >= 2) cutlass::arch::NamedBarrier::sync(kThreads, kEmpty + slot);
    const int32_t M = static_cast<int32_t>(cute::get<0>(problem_shape));
    const int32_t N = static_cast<int32_t>(cute::get<1>(problem_shape));
    const int32_t row0 = static_cast<int32_t>(cute::get<0>(tile_coord)) * kTileM;
    const int32_t col0 = static_cast<int32_t>(cute::get<1>(tile_coord)) * kTileN;
    const int32_t row1 = min(row0 + kTileM, M);
    const bool local = row0 >= params_.local_begin && row1 <= params_.local_end;
    if (!local && params_.chunks.flags != nullptr) wait_for_chunk_rows(params_.chunks, row0, row1);
    // The lane is read here (opaque_thread_index): taken from the kernel's thread_idx, the compiler
    // shared its arithmetic with the consumers', and ptxas spilled.
    shared_tensors.slots[slot].stage(params_.row_scales, params_.col_scales, row0, col0, M, N,
                                     opaque_thread_index() % cutlass::NumThreadsPerWarp);
    cutlass::arch::NamedBarrier::arrive(kThreads, kFull + slot);
    ++tiles_;
    if (Base::is_producer_load_needed()) {
      state = Base::load(load_pipeline, state, problem_shape, tile_shape, tile_coord, tiled_mma, thread_idx, shared_tensors,
                         subtile_idx);
    }
    return state;
  }

  CUTLASS_DEVICE auto load_tail(typename Base::LoadPipeline load_pipeline, typename Base::LoadPipelineState state) {
    for (uint32_t t = tiles_ >= 2 ? tiles_ - 2 : 0; t < tiles_; ++t) {
      cutlass::arch::NamedBarrier::sync(kThreads, kEmpty + (t & 1u));
    }
    if (Base::is_producer_load_needed()) state = Base::load_tail(load_pipeline, state);
    return state;
  }

  template <class ProblemShapeMNKL, class TileShapeMNK, class TileCoordMNKL, class AccEngine, class AccLayout,
            class TiledMma>
  CUTLASS_DEVICE auto store(typename Base::LoadPipeline load_pipeline, typename Base::LoadPipelineState load_state,
                            typename Base::StorePipeline store_pipeline, typename Base::StorePipelineState store_state,
                            ProblemShapeMNKL problem_shape, TileShapeMNK tile_shape, TileCoordMNKL tile_coord,
                            cute::Tensor<AccEngine, AccLayout> accumulators, TiledMma tiled_mma, int thread_idx,
                            TensorStorage& shared_tensors, int subtile_idx = -1) {
    static_assert(cute::size(TiledMma{}) == kConsumerThreads, "the cooperative kernel's two consumer warpgroups");
    // The tiles stored so far, from the store pipeline's count of subtiles: a counter of its own would
    // hold a register through the mainloop, and the consumers have none to spare (ptxas spilled).
    constexpr uint32_t kSubtiles = Base::get_store_pipe_increment(TileShape{});
    const uint32_t slot = store_state.count() / kSubtiles & 1u;
    cutlass::arch::NamedBarrier::sync(kThreads, kFull + slot);
    shared_tensors.slots[slot].scale(opaque_thread_index(), kConsumerThreads, accumulators);
    cutlass::arch::NamedBarrier::arrive(kThreads, kEmpty + slot);
    return Base::store(load_pipeline, load_state, store_pipeline, store_state, problem_shape, tile_shape, tile_coord,
                       accumulators, tiled_mma, thread_idx, shared_tensors, subtile_idx);
  }

 private:
  static constexpr uint32_t kConsumerThreads = 2 * cutlass::NumThreadsPerWarpGroup;
  static constexpr uint32_t kThreads = cutlass::NumThreadsPerWarp + kConsumerThreads;  // at each barrier
  // Named barriers of CUTLASS's user range: kFull + slot and kEmpty + slot. (The reduce-scatter's
  // epilogue, in other instantiations, takes 0.)
  static constexpr uint32_t kFull = 1, kEmpty = 3;

  Params const& params_;
  uint32_t tiles_ = 0;  // tiles the epilogue warp has loaded
};

}  // namespace asynctp::kernels::fused
