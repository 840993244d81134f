// A CUTLASS Hopper TMA mainloop whose A rows arrive chunk by chunk.
//
// AsyncInputMainloop<Base> wraps a collective built by CUTLASS's CollectiveBuilder (Base, the
// warp-specialized TMA + WGMMA mainloop) and changes only its producer side, in load():
//  - before the first TMA load of a tile, the producer warp waits until every chunk of A rows the
//    tile covers has landed (chunk_wait.cuh: the flag set by the copy engine that moved the chunk,
//    after the data);
//  - a tile whose rows all lie in this rank's own shard is read straight from the caller's tensor
//    through a second TMA descriptor, so the GEMM starts before any copy of the shard exists. That
//    descriptor addresses the shard alone, and the tile's rows are given to it relative to the shard
//    (one that started before the shard, to be indexed by A's rows, could fault: docs/design/fused_all_gather_matmul.md).
// The consumer side (WGMMA, the pipeline, the epilogue) is Base's; mma() only hands Base's loop its
// pipeline position and trip count as warp-uniform values.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>

#include "kernels/fused/chunk_wait.cuh"

namespace asynctp::kernels::fused {

template <class Base>
struct AsyncInputMainloop : Base {
  using typename Base::ElementA;
  using typename Base::MainloopPipeline;
  using typename Base::PipelineState;
  using typename Base::TensorStorage;
  using BaseParams = typename Base::Params;
  static constexpr int kTileM = cute::size<0>(typename Base::TileShape{});

  struct Arguments {
    typename Base::Arguments gathered;  // A as gathered, and B
    // The caller's own rows: rows [local_begin, local_end) of A are read from here. Null: every row is
    // read from `gathered`.
    ElementA const* ptr_A_local = nullptr;
    int32_t local_begin = 0, local_end = 0;
    ChunkFlags chunks{};
  };

  struct Params : BaseParams {
    BaseParams local;  // Base's parameters with the TMA descriptor of the caller's own rows
    int32_t M = 0, K = 0;
    int32_t local_begin = 0, local_end = 0;
    ChunkFlags chunks{};
  };

  template <class ProblemShape>
  static Params to_underlying_arguments(ProblemShape const& problem_shape, Arguments const& args, void* workspace) {
    Params p;
    static_cast<BaseParams&>(p) = Base::to_underlying_arguments(problem_shape, args.gathered, workspace);
    typename Base::Arguments local = args.gathered;
    ProblemShape local_shape = problem_shape;
    if (args.ptr_A_local != nullptr) {
      local.ptr_A = args.ptr_A_local;  // rows K apart, as in A
      cute::get<0>(local_shape) = args.local_end - args.local_begin;
    }
    p.local = Base::to_underlying_arguments(local_shape, local, workspace);
    p.M = static_cast<int32_t>(cute::get<0>(problem_shape));
    p.K = static_cast<int32_t>(cute::get<2>(problem_shape));
    p.local_begin = args.ptr_A_local != nullptr ? args.local_begin : 0;
    p.local_end = args.ptr_A_local != nullptr ? args.local_end : 0;
    p.chunks = args.chunks;
    return p;
  }

  template <class ProblemShape>
  static bool can_implement(ProblemShape const& problem_shape, Arguments const& args) {
    const bool chunks_ok = args.chunks.flags == nullptr ||
                           (args.chunks.epoch != nullptr && args.chunks.rows_per_rank > 0 && args.chunks.rows_per_chunk > 0);
    return chunks_ok && Base::can_implement(problem_shape, args.gathered);
  }

  CUTLASS_DEVICE static void prefetch_tma_descriptors(Params const& params) {
    Base::prefetch_tma_descriptors(params);
    if (params.local_end > params.local_begin) Base::prefetch_tma_descriptors(params.local);
  }

  // Lane 0's value, which the compiler then knows is the same in every lane: the whole warp calls these.
  CUTLASS_DEVICE static int warp_uniform(int value) { return __shfl_sync(0xffffffffu, value, 0); }
  // The stage and phase only: the count is not read by Base's loops, and a copy of it costs a register.
  CUTLASS_DEVICE static PipelineState warp_uniform(PipelineState state) {
    return PipelineState(warp_uniform(state.index()), static_cast<uint32_t>(warp_uniform(static_cast<int>(state.phase()))),
                         state.count());
  }

  // Consumer warpgroups: Base's mainloop, given its pipeline position and trip count as values the
  // compiler can see are warp-uniform (broadcast from lane 0). Derived from the kernel's own state,
  // they sit in per-thread registers, and every WGMMA descriptor of the loop was rebuilt there and
  // moved to uniform registers one word at a time (four R2UR per WGMMA); as uniform values, the
  // descriptors are computed in the uniform datapath.
  template <class FrgTensorC>
  CUTLASS_DEVICE void mma(MainloopPipeline pipeline, PipelineState smem_pipe_read, FrgTensorC& accum, int k_tile_count,
                          int thread_idx, TensorStorage& shared_tensors, Params const& params) {
    Base::mma(pipeline, warp_uniform(smem_pipe_read), accum, warp_uniform(k_tile_count), thread_idx, shared_tensors,
              params);
  }

  // Producer warp: wait for the tile's rows, then Base's TMA loads from the right descriptor.
  template <class TensorA, class TensorB, class KTileIterator, class BlockCoord>
  CUTLASS_DEVICE void load(Params const& params, MainloopPipeline pipeline, PipelineState smem_pipe_write,
                           cute::tuple<TensorA, TensorB> const& load_inputs, BlockCoord const& blk_coord,
                           KTileIterator k_tile_iter, int k_tile_count, int thread_idx, uint32_t block_rank_in_cluster,
                           TensorStorage& shared_tensors) {
    const int32_t row0 = static_cast<int32_t>(cute::get<0>(blk_coord)) * kTileM;
    const int32_t row1 = min(row0 + kTileM, params.M);
    const bool local = row0 >= params.local_begin && row1 <= params.local_end;
    if (!local) {
      if (params.chunks.flags != nullptr && row0 < row1) wait_for_chunk_rows(params.chunks, row0, row1);
      Base::load(params, pipeline, smem_pipe_write, load_inputs, blk_coord, k_tile_iter, k_tile_count, thread_idx,
                 block_rank_in_cluster, shared_tensors);
      return;
    }
    // A's tiles as the local descriptor sees them: A's row r is the shard's row r - local_begin.
    using X = cute::Underscore;
    auto mA = params.local.tma_load_a.get_tma_tensor(cute::make_shape(params.M, params.K, 1));
    auto gA = cute::local_tile(cute::domain_offset(cute::make_coord(-params.local_begin, 0, 0), mA),
                               typename Base::TileShape{}, cute::make_coord(cute::_, cute::_, cute::_),
                               cute::Step<cute::_1, X, cute::_1>{});
    Base::load(params.local, pipeline, smem_pipe_write, cute::make_tuple(gA, cute::get<1>(load_inputs)), blk_coord,
               k_tile_iter, k_tile_count, thread_idx, block_rank_in_cluster, shared_tensors);
  }
};

}  // namespace asynctp::kernels::fused
