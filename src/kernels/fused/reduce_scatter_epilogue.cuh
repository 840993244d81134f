// The epilogue of the fused reduce-scatter's partial GEMM on two ranks: the reduction happens in it
// (docs/design/fused_matmul_reduce_scatter.md, "Two ways of reducing").
//
// ReduceScatterEpilogue<Base, Plain> runs one of two CUTLASS Hopper TMA epilogues per tile:
//  - a staged tile (the peer's rows): Plain, CUTLASS's epilogue without a source, as a plain GEMM's
//    tile has it (its TMA stores delayed by a subtile, two store stages), stores the tile into this
//    GPU's staging buffer, row-major like the product; once the tile's stores are complete, consumer
//    warp 0 counts it for its chunk, and the copy engine pushes the chunk to the peer when the count
//    is whole; or, pushed from the kernel (ReduceScatterTiles::push_inbox), the stores write the tile
//    into the peer's inbox over NVLink and warp 0 counts it in the peer's pad;
//  - an own tile: Base, which reads a source C (C's shared memory reused for D), stores D = scale *
//    accumulators + scale * C in fp32 into the caller's output, C being the peer's copy of the same
//    rows in this rank's inbox (both addressed as this rank's rows alone: row_window_epilogue.cuh); the
//    producer warp that loads C first waits for the peer's arrived flag of the tile's chunk.
// So neither kind of tile costs the consumer warps more than an ordinary epilogue (with a source, for
// an own tile): no per-thread stores or loads in fixup(), and C is loaded by the producer warp while
// the consumers still run the tile's mainloop.
//
// The two share the epilogue's shared memory (Plain's D buffers lie in the first of Base's), which is
// sound because of the order a CTA meets its tiles in (every staged tile before every own tile,
// async_input_scheduler.cuh): staged tiles use a store pipeline of their own and load nothing, so
// Base's pipelines stand where they were, and before the producer warp loads the first own tile's C
// into buffers the staged tiles stored from, it waits (a named barrier) until consumer warp 0 has seen
// the last staged tile's stores complete.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/cutlass.h>

#include <type_traits>

#include "kernels/fused/fused_gemm.h"
#include "kernels/fused/reduce_scatter_tiles.h"
#include "kernels/fused/row_window_epilogue.cuh"
#include "kernels/signal.cuh"

namespace asynctp::kernels::fused {

template <class Base, class Plain>
class ReduceScatterEpilogue {
 public:
  using ElementC = typename Base::ElementC;
  using StrideC = typename Base::StrideC;
  using ElementD = typename Base::ElementD;
  using StrideD = typename Base::StrideD;
  using LoadPipeline = typename Base::LoadPipeline;
  using LoadPipelineState = typename Base::LoadPipelineState;
  using StorePipeline = typename Base::StorePipeline;
  using StorePipelineState = typename Base::StorePipelineState;
  using SharedStorage = typename Base::SharedStorage;
  using TensorStorage = typename Base::TensorStorage;
  using PipelineStorage = typename Base::PipelineStorage;
  using GmemTiledCopyC = typename Base::GmemTiledCopyC;  // the device adapter reads these three
  using GmemTiledCopyD = typename Base::GmemTiledCopyD;
  using ThreadEpilogueOp = typename Base::ThreadEpilogueOp;
  static constexpr bool RequiresTransactionBytes = Base::RequiresTransactionBytes;
  static constexpr int kTileM = static_cast<int>(kTileRows);

  // Each addresses one rank's m rows alone (row_window_epilogue.cuh): own's this rank's, staged's the
  // peer's.
  using Own = RowWindowEpilogue<Base>;
  using Staged = RowWindowEpilogue<Plain>;
  struct Arguments {
    typename Own::Arguments own;        // D: the output; C: the peer's copy of this rank's rows; beta != 0
    typename Staged::Arguments staged;  // D: the staging buffer's slot of the peer, or the peer's inbox; no source
    ReduceScatterTiles rs{};
  };

  struct Params {
    typename Own::Params own;
    typename Staged::Params staged;
    ReduceScatterTiles rs{};
    uint32_t tma_transaction_bytes = 0;  // read by the kernel for the load pipeline
  };

  template <class ProblemShape>
  static Params to_underlying_arguments(ProblemShape const& problem_shape, Arguments const& args, void* workspace) {
    Params p;
    p.own = Own::to_underlying_arguments(problem_shape, args.own, workspace);
    p.staged = Staged::to_underlying_arguments(problem_shape, args.staged, workspace);
    p.rs = args.rs;
    p.tma_transaction_bytes = p.own.tma_transaction_bytes;
    return p;
  }

  template <class ProblemShape>
  static bool can_implement(ProblemShape const& problem_shape, Arguments const& args) {
    return args.rs.rank >= 0 && args.rs.world == 2 && args.rs.reduce_in_epilogue &&
           Own::can_implement(problem_shape, args.own) && Staged::can_implement(problem_shape, args.staged);
  }

  // The linear-combination epilogues need no workspace; Base and Plain say so.
  template <class ProblemShape>
  static size_t get_workspace_size(ProblemShape const& problem_shape, Arguments const& args) {
    return Base::get_workspace_size(problem_shape, args.own) + Plain::get_workspace_size(problem_shape, args.staged);
  }

  template <class ProblemShape>
  static cutlass::Status initialize_workspace(ProblemShape const&, Arguments const&, void*, cudaStream_t,
                                              cutlass::CudaHostAdapter* = nullptr) {
    return cutlass::Status::kSuccess;
  }

  template <class TileShapeMNK>
  CUTLASS_HOST_DEVICE static constexpr int get_load_pipe_increment(TileShapeMNK tile_shape) {
    return Base::get_load_pipe_increment(tile_shape);
  }

  template <class TileShapeMNK>
  CUTLASS_HOST_DEVICE static constexpr int get_store_pipe_increment(TileShapeMNK tile_shape) {
    return Base::get_store_pipe_increment(tile_shape);
  }

  CUTLASS_DEVICE static void prefetch_tma_descriptors(Params const& params) {
    Base::prefetch_tma_descriptors(params.own);
    Plain::prefetch_tma_descriptors(params.staged);
  }

  CUTLASS_DEVICE ReduceScatterEpilogue(Params const& params, TensorStorage& shared_tensors)
      : params_(params), own_(params.own, shared_tensors), staged_(params.staged, plain_storage(shared_tensors)) {}

  CUTLASS_DEVICE bool is_producer_load_needed() const { return own_.is_producer_load_needed(); }

  // The producer warp, for each tile with an epilogue. `release` (the scheduler's
  // reduction_subtile_idx) is unused here.
  template <class ProblemShapeMNKL, class TileShapeMNK, class TileCoordMNKL, class TiledMma>
  CUTLASS_DEVICE auto load(LoadPipeline load_pipeline, LoadPipelineState state, ProblemShapeMNKL problem_shape,
                           TileShapeMNK tile_shape, TileCoordMNKL tile_coord, TiledMma tiled_mma, int thread_idx,
                           TensorStorage& shared_tensors, int /*release*/ = -1) {
    const int32_t row0 = static_cast<int32_t>(cute::get<0>(tile_coord)) * kTileM;
    if (is_staged(row0)) {
      after_staged_ = true;
      return state;
    }
    if (after_staged_) {
      cutlass::arch::NamedBarrier::sync(kGateThreads, kGateBarrier);
      after_staged_ = false;
    }
    wait_for_peer(row0);
    return own_.load(load_pipeline, state, problem_shape, tile_shape, tile_coord, tiled_mma, thread_idx,
                     shared_tensors, -1);
  }

  CUTLASS_DEVICE auto load_tail(LoadPipeline load_pipeline, LoadPipelineState state) {
    return own_.load_tail(load_pipeline, state);
  }

  // The consumer warpgroups, for each tile with an epilogue. `release` is the scheduler's
  // reduction_subtile_idx(): for a staged tile, (tiles to count << 1) | (the next tile is an own one).
  // A staged tile hands back the kernel's (Base's) pipeline states as they came.
  template <class ProblemShapeMNKL, class TileShapeMNK, class TileCoordMNKL, class AccEngine, class AccLayout,
            class TiledMma>
  CUTLASS_DEVICE auto store(LoadPipeline load_pipeline, LoadPipelineState load_state, StorePipeline store_pipeline,
                            StorePipelineState store_state, ProblemShapeMNKL problem_shape, TileShapeMNK tile_shape,
                            TileCoordMNKL tile_coord, cute::Tensor<AccEngine, AccLayout> accumulators,
                            TiledMma tiled_mma, int thread_idx, TensorStorage& shared_tensors, int release = -1) {
    const int32_t row0 = static_cast<int32_t>(cute::get<0>(tile_coord)) * kTileM;
    if (!is_staged(row0)) {
      stored_own_ = true;
      return own_.store(load_pipeline, load_state, store_pipeline, store_state, problem_shape, tile_shape, tile_coord,
                        accumulators, tiled_mma, thread_idx, shared_tensors, -1);
    }
    if (!pushing_ && params_.rs.push_inbox != nullptr) {
      if (thread_idx < cutlass::NumThreadsPerWarp) wait_until_peer_done();
      pushing_ = true;
    }
    // Plain loads nothing (no source), so it leaves the load pipeline and its state alone.
    auto [unused_load_state, next_plain_state] =
        staged_.store(load_pipeline, load_state, plain_store_pipeline(), plain_store_state_, problem_shape, tile_shape,
                      tile_coord, accumulators, tiled_mma, thread_idx, plain_storage(shared_tensors), -1);
    (void)unused_load_state;
    plain_store_state_ = next_plain_state;
    if (release > 0 && thread_idx < cutlass::NumThreadsPerWarp) count_staged(row0, release);
    return cute::make_tuple(load_state, store_state);
  }

  CUTLASS_DEVICE auto store_tail(LoadPipeline load_pipeline, LoadPipelineState load_state, StorePipeline store_pipeline,
                                 StorePipelineState store_state) {
    // Base's tail hands back the load stages an own tile still holds; after staged tiles only there are
    // none, and handing any back would run ahead of the producer warp: only Plain's stores are waited for.
    if (stored_own_) return own_.store_tail(load_pipeline, load_state, store_pipeline, store_state);
    staged_.store_tail(load_pipeline, load_state, plain_store_pipeline(), plain_store_state_);
    return cute::make_tuple(load_state, store_state);
  }

 private:
  // Consumer warp 0 (whose lanes issue the TMA stores) and the producer's epilogue warp.
  static constexpr uint32_t kGateThreads = 2 * cutlass::NumThreadsPerWarp;
  static constexpr uint32_t kGateBarrier = 0;  // the first named barrier CUTLASS leaves to its users

  CUTLASS_DEVICE bool is_staged(int32_t row0) const { return params_.rs.is_staged(row0); }

  // Plain's shared memory: the start of Base's, which staged and own tiles use in turn (above).
  CUTLASS_DEVICE static typename Plain::TensorStorage& plain_storage(TensorStorage& shared_tensors) {
    static_assert(sizeof(typename Plain::TensorStorage) <= sizeof(TensorStorage) &&
                      alignof(TensorStorage) % alignof(typename Plain::TensorStorage) == 0,
                  "Plain's shared memory must fit in Base's");
    static_assert(std::is_same_v<typename Plain::LoadPipeline, LoadPipeline> &&
                      std::is_same_v<typename Plain::LoadPipelineState, LoadPipelineState>,
                  "Plain is handed Base's load pipeline, which it does not use");
    return *reinterpret_cast<typename Plain::TensorStorage*>(&shared_tensors);
  }

  // Plain's store pipeline holds no state but its parameters (the bulk-copy groups are the issuing
  // warp's); its position is plain_store_state_. Every acquire waits, as the kernel has it for Base's.
  CUTLASS_DEVICE static typename Plain::StorePipeline plain_store_pipeline() {
    typename Plain::StorePipeline::Params params;
    params.always_wait = true;
    return typename Plain::StorePipeline(params);
  }


  // Every lane waits and fences, as the mainloop's producer does (async_input_mainloop.cuh), so the lane
  // Base elects to issue the TMA loads has itself acquired the flag. Pushed from the kernel, the chunk
  // is there once the peer's count of it shows all its tiles; else once its arrived flag shows the epoch.
  CUTLASS_DEVICE void wait_for_peer(int32_t row0) const {
    ReduceScatterTiles const& rs = params_.rs;
    const int32_t peer = 1 - rs.rank;
    const int32_t chunk = rs.chunk_of(row0);
    if (rs.push_inbox != nullptr) {
      wait_flag_sys</*kPrint=*/false>(rs.pushed + chunk, rs.tiles_in_chunk(chunk), peer, rs.push_pad_index + chunk,
                                      rs.wait);
    } else {
      const int32_t index = peer * rs.flag_stride + chunk;
      wait_flag_sys</*kPrint=*/false>(rs.arrived + index, rs.arrival_epoch(), peer, rs.pad_index + index, rs.wait);
    }
    asm volatile("fence.proxy.async.global;" ::: "memory");
    __syncwarp();
  }

  // Consumer warp 0, before this CTA's first store into the peer's inbox: the peer is done with the
  // call before this one (its done flag carries that call's epoch), so it no longer reads what the
  // stores overwrite. The fence orders the acquire before the stores, which the async proxy makes.
  CUTLASS_DEVICE void wait_until_peer_done() const {
    ReduceScatterTiles const& rs = params_.rs;
    const int32_t peer = 1 - rs.rank;
    // The peer's done flag is word `peer` of this rank's pad (OverlapResources::done_flag), as a
    // timeout report names it.
    wait_flag_sys</*kPrint=*/false>(rs.peer_done, rs.arrival_epoch() - 1, peer, peer, rs.wait);
    asm volatile("fence.proxy.async.global;" ::: "memory");
    __syncwarp();
  }

  // Consumer warp 0, after a staged tile's stores: once they are complete in memory (not only read
  // out of shared memory), add the tiles to the chunk's count with a GPU-scope release, which the copy
  // engine's wait (a stream memory operation on this GPU) then sees, or, pushed from the kernel, to
  // the peer's count with a system-scope one; and where an own tile comes next, let the producer warp
  // load its C.
  CUTLASS_DEVICE void count_staged(int32_t row0, int release) const {
    ReduceScatterTiles const& rs = params_.rs;
    asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
    asm volatile("fence.proxy.async.global;" ::: "memory");
    __syncwarp();
    if (threadIdx.x % cutlass::NumThreadsPerWarp == 0) {
      const uint32_t tiles = static_cast<uint32_t>(release >> 1);
      if (rs.push_inbox != nullptr) {
        rs.add_pushed(row0, tiles);
      } else {
        rs.add_staged(row0, tiles);
      }
    }
    __syncwarp();
    if (release & 1) cutlass::arch::NamedBarrier::arrive(kGateThreads, kGateBarrier);
  }

  Params const& params_;
  Own own_;
  Staged staged_;
  typename Plain::StorePipelineState plain_store_state_{};  // consumers: where the staged tiles' stores are
  bool after_staged_ = false;  // producer warp: a staged tile has gone by since the gate
  bool stored_own_ = false;    // consumers: an own tile has been stored
  bool pushing_ = false;       // consumers: the peer is done with the call before (pushed from the kernel)
};

}  // namespace asynctp::kernels::fused
