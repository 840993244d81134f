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
//
// A reduce-scatter with fp8's row-wise scales reads them from shared memory (row_scale_slot.cuh),
// where the producer warpgroup's epilogue warp (idle otherwise: Base loads no source) puts each
// tile's a tile ahead: loads from global memory would lengthen an epilogue that at short K already
// outlasts the other warpgroup's mainloop (docs/design/fused_matmul_reduce_scatter.md). The kernel hands the CTA's tiles to its two consumer warpgroups in turn, and the epilogue warp
// loads them in that order, so tile t's scales go in slot t % 2, the slot of warpgroup t % 2; each
// slot is handed over through two named barriers (`full`: the epilogue warp has written it; `empty`:
// the warpgroup has read it), as in row_scale_epilogue.cuh.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/arch/barrier.h>
#include <cutlass/fast_math.h>

#include <type_traits>

#include "kernels/fused/reduce_scatter_fixup.cuh"
#include "kernels/fused/reduce_scatter_tiles.h"
#include "kernels/fused/row_scale_slot.cuh"
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

  static constexpr int kTileN = cute::size<1>(typename Base::CtaTileMNK{});
  using Slot = RowScaleSlot<Window::kTileM, kTileN>;
  struct ScaledStorage : Base::TensorStorage {
    Slot slots[2];
  };
  // The slots only where an instantiation may take row-wise scales: the 16-bit ones' mainloop keeps
  // every byte.
  using TensorStorage = std::conditional_t<kScaled, ScaledStorage, typename Base::TensorStorage>;
  using PipelineStorage = typename Base::PipelineStorage;
  struct SharedStorage {
    TensorStorage tensors;
    PipelineStorage pipeline;
  };

  CUTLASS_DEVICE PingpongEpilogue(Params const& params, TensorStorage& shared_tensors)
      : Window(params, shared_tensors), params_(params) {}

  // The epilogue warp runs for the row-wise scales, whatever Base needs.
  CUTLASS_DEVICE bool is_producer_load_needed() const { return stages_row_scales() || Base::is_producer_load_needed(); }

  // The epilogue warp, for each tile in the order the warpgroups store them.
  template <class ProblemShapeMNKL, class TileShapeMNK, class TileCoordMNKL, class TiledMma>
  CUTLASS_DEVICE auto load(typename Base::LoadPipeline load_pipeline, typename Base::LoadPipelineState state,
                           ProblemShapeMNKL problem_shape, TileShapeMNK tile_shape, TileCoordMNKL tile_coord,
                           TiledMma tiled_mma, int thread_idx, TensorStorage& shared_tensors, int subtile_idx = -1) {
    if constexpr (kScaled) {
      if (stages_row_scales()) {
        const uint32_t slot = tiles_ & 1u;
        if (tiles_ >= 2) cutlass::arch::NamedBarrier::sync(kSlotThreads, kEmpty + slot);
        // The lane is read here (opaque_thread_index), as in row_scale_epilogue.cuh: the epilogue warp
        // has 40 registers.
        shared_tensors.slots[slot].stage(params_.rs.row_scales, params_.rs.col_scales,
                                         static_cast<int32_t>(cute::get<0>(tile_coord)) * Window::kTileM,
                                         static_cast<int32_t>(cute::get<1>(tile_coord)) * kTileN,
                                         static_cast<int32_t>(cute::get<0>(problem_shape)), params_.rs.cols,
                                         opaque_thread_index() % cutlass::NumThreadsPerWarp);
        cutlass::arch::NamedBarrier::arrive(kSlotThreads, kFull + slot);
        ++tiles_;
      }
    }
    if (Base::is_producer_load_needed()) {
      state = Window::load(load_pipeline, state, problem_shape, tile_shape, tile_coord, tiled_mma, thread_idx,
                           shared_tensors, subtile_idx);
    }
    return state;
  }

  // Waits until the warpgroups have read the last two slots, so that no barrier is left half-arrived.
  CUTLASS_DEVICE auto load_tail(typename Base::LoadPipeline load_pipeline, typename Base::LoadPipelineState state) {
    if constexpr (kScaled) {
      for (uint32_t t = tiles_ >= 2 ? tiles_ - 2 : 0; t < tiles_; ++t) {
        cutlass::arch::NamedBarrier::sync(kSlotThreads, kEmpty + (t & 1u));
      }
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
    if (params_.rs.rank >= 0) {
      const int32_t m = static_cast<int32_t>(cute::get<0>(tile_coord)), n = static_cast<int32_t>(cute::get<1>(tile_coord));
      // Each way inlined for its kind of tile alone: one copy for both held the warpgroup past its
      // registers (ptxas spilled).
      if (params_.rs.is_staged(m * Window::kTileM, params_.rank_rows_div)) {
        reduce(Tile</*kStaged=*/true>{m, n}, accumulators, thread_idx, shared_tensors);
        return cute::make_tuple(load_state, store_state);
      }
      reduce(Tile</*kStaged=*/false>{m, n}, accumulators, thread_idx, shared_tensors);
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

  // reduce_scatter_fixup() on the warpgroup's tile (`thread_idx`: the thread's place in the warpgroup),
  // its row-wise scales read from the warpgroup's slot once the epilogue warp has filled it.
  template <class TileKind, class Accumulators>
  CUTLASS_DEVICE void reduce(TileKind const& tile, Accumulators& accumulators, int thread_idx,
                             TensorStorage& shared_tensors) const {
    auto scale_rows = [&](int32_t /*row0*/, int32_t /*n_idx*/, Accumulators& acc) {
      if constexpr (kScaled) {
        const uint32_t slot = opaque_thread_index() / cutlass::NumThreadsPerWarpGroup - 1;  // consumer warpgroup 0 or 1
        cutlass::arch::NamedBarrier::sync(kSlotThreads, kFull + slot);
        shared_tensors.slots[slot].scale(static_cast<uint32_t>(thread_idx), cutlass::NumThreadsPerWarpGroup, acc);
        cutlass::arch::NamedBarrier::arrive(kSlotThreads, kEmpty + slot);
      }
    };
    reduce_scatter_fixup<typename Base::ElementD, kScaled>(params_.rs, Window::kTileM, params_.rank_rows_div,
                                                           params_.chunk_rows_div, tile, accumulators,
                                                           static_cast<uint32_t>(thread_idx),
                                                           cutlass::NumThreadsPerWarpGroup, [](int) {}, scale_rows);
  }

  // Where the tiles take row-wise scales: every tile of the call then, staged or own (uniform).
  CUTLASS_DEVICE bool stages_row_scales() const {
    return kScaled && params_.rs.rank >= 0 && params_.rs.partial_scale == nullptr && params_.rs.row_scales != nullptr;
  }

  // A warpgroup and the epilogue warp meet at each barrier.
  static constexpr uint32_t kSlotThreads = cutlass::NumThreadsPerWarp + cutlass::NumThreadsPerWarpGroup;
  // Named barriers of CUTLASS's user range: kFull + slot and kEmpty + slot, as row_scale_epilogue.cuh,
  // which no instantiation runs beside this one.
  static constexpr uint32_t kFull = 1, kEmpty = 3;

  Params const& params_;
  uint32_t tiles_ = 0;  // the epilogue warp: tiles whose scales it has staged
};

}  // namespace asynctp::kernels::fused
