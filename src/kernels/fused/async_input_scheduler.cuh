// A persistent tile scheduler for a GEMM whose A rows arrive chunk by chunk (the fused all-gather).
//
// It plugs into CUTLASS's Hopper warp-specialized kernels, cooperative and ping-pong, in place of
// PersistentTileSchedulerSm90 (the kernel picks it through TileSchedulerSelector and the
// AsyncInputSchedule tag). What it changes is the order of the output tiles only:
//  - each persistent cluster walks cluster tiles t = cluster_id, cluster_id + clusters, ...;
//  - t maps to rows of cluster tiles in order, starting at `first_m_cluster` (the first cluster row
//    that starts inside this rank's own shard) and wrapping around, so the local rows, which need no
//    communication, are multiplied first and each peer's rows follow in the order they arrive (the
//    peers push in rank order after this rank; docs/design/fused_all_gather_matmul.md);
//  - within a band of `band_m` cluster rows it goes down the rows before moving along N (band_m = 1:
//    row by row), which trades A reuse for B reuse in L2.
// Walking in that rotated order makes the rows a tile needs non-decreasing in arrival time, so a
// cluster that waits for a chunk never holds up one that could run. The waiting itself is the
// mainloop's job (async_input_mainloop.cuh).
//
// Where the last round of tiles would leave most clusters idle, its tiles are split along K
// (tail_split.h): clusters take work units rather than tiles, the tail's units all in the last round,
// and fixup() sums a tile's splits in its last one (tail_split_fixup.cuh; a reduce-scatter's staging
// and reduction are reduce_scatter_fixup.cuh). The host builds the Params (async_input_params.h); the
// done signal is done_signal.cuh.
#pragma once

#include <algorithm>

#include <cute/arch/cluster_sm90.hpp>
#include <cute/tensor.hpp>
#include <cutlass/fast_math.h>
#include <cutlass/gemm/kernel/tile_scheduler.hpp>
#include <cutlass/kernel_hardware_info.hpp>
#include <cutlass/pipeline/pipeline.hpp>

#include "kernels/fused/async_input_params.h"
#include "kernels/fused/done_signal.cuh"
#include "kernels/fused/reduce_scatter_fixup.cuh"
#include "kernels/fused/reduce_scatter_tiles.h"
#include "kernels/fused/tail_split.h"
#include "kernels/fused/tail_split_fixup.cuh"
#include "kernels/fused/tile_trace.cuh"

namespace asynctp::kernels::fused {

// Tag that selects AsyncInputTileScheduler in GemmUniversal; Element is the output type (a reduce-scatter's
// staged partial sums are rounded to it); kScaled: fp8's, whose reduce-scatter scales (reduce_scatter_fixup.cuh).
template <class Element, bool kScaled = false>
struct AsyncInputSchedule {};

template <class Element, bool kScaled = false>
class AsyncInputTileScheduler {
 public:
  // The kernel refers to these names when it sizes its launch; the raster is fixed (see above).
  using RasterOrder = AsyncInputRasterOrder;
  using RasterOrderOptions = AsyncInputRasterOrderOptions;
  static constexpr bool IsDynamicPersistent = false;

  using Pipeline = cutlass::PipelineEmpty;
  using PipelineStorage = typename Pipeline::SharedStorage;
  using ThrottlePipeline = cutlass::PipelineEmpty;
  using ThrottlePipelineStorage = typename ThrottlePipeline::SharedStorage;
  struct CLCResponse {};
  class SharedStorage {
   public:
    CUTLASS_DEVICE PipelineStorage pipeline() { return PipelineStorage{}; }
    CUTLASS_DEVICE ThrottlePipelineStorage throttle_pipeline() { return ThrottlePipelineStorage{}; }
    CUTLASS_DEVICE CLCResponse* data() { return nullptr; }
  };

  using Arguments = AsyncInputArguments;
  using Params = AsyncInputParams;

  // What the consumers hold across a tile's mainloop, beside its 128 accumulators, shares the 232
  // registers setmaxnreg gives them with fixup()'s loads, which ptxas keeps in flight up to that limit
  // (nvdisasm's life ranges: 224-229 live there), so every word here costs: fields a tile's
  // later steps can derive (its split slot, from the unit) are not kept, the small ones share one word,
  // L_idx is a constant, and the scheduler keeps no copy of the unit or of the staged run. With a dozen
  // words the consumers' mainloop spilled its pipeline state and rebuilt its shared-memory addresses
  // every step (commit 0bb3b77; docs/design/fused_all_gather_matmul.md).
  struct WorkTileInfo {
    int32_t M_idx = 0;
    int32_t N_idx = 0;
    cute::C<0> L_idx{};  // empty: the batch coordinate is known at compile time
    int32_t unit = -1;                 // the scheduler's work unit; negative: no tile (the loops end)
    int32_t k_begin = 0, k_count = 0;  // this unit's steps along K
    // Bits, low to high: split (4), splits (4; 1: the tile is whole), staged (a reduce-scatter tile of
    // another rank's rows), and on a staged tile's last split as the consumers get it (visit()):
    // releases (this tile adds the run to its chunk's count), own_next (the CTA's next tile with an
    // epilogue is an own one, where the epilogue stores staged tiles), run (whole staged tiles of the
    // chunk this one ends, itself included; 0 on every other tile).
    uint32_t bits = 1u << kSplitsShift;
    static constexpr uint32_t kSplitsShift = 4, kStaged = 1u << 8, kReleases = 1u << 9, kOwnNext = 1u << 10;
    static constexpr uint32_t kRunShift = 11, kMaxRun = ~0u >> kRunShift;
    CUTLASS_HOST_DEVICE bool is_valid() const { return unit >= 0; }
    CUTLASS_HOST_DEVICE int32_t split() const { return static_cast<int32_t>(bits & 0xFu); }
    CUTLASS_HOST_DEVICE int32_t splits() const { return static_cast<int32_t>((bits >> kSplitsShift) & 0xFu); }
    CUTLASS_HOST_DEVICE bool staged() const { return (bits & kStaged) != 0; }
    CUTLASS_HOST_DEVICE uint32_t run() const { return bits >> kRunShift; }
    // The staged tiles this one adds to its chunk's count (0: a later tile of the run counts them).
    CUTLASS_HOST_DEVICE uint32_t staged_count() const { return (bits & kReleases) != 0 ? run() : 0u; }
    CUTLASS_HOST_DEVICE bool own_next() const { return (bits & kOwnNext) != 0; }
    CUTLASS_HOST_DEVICE static WorkTileInfo invalid_work_tile() { return WorkTileInfo{}; }
    CUTLASS_HOST_DEVICE bool is_final_split(uint32_t) const { return split() + 1 == splits(); }
    // The kernel hands this to the epilogue's load() and store(), where CUTLASS's epilogue would read
    // it as the one subtile to store (-1: all; row_window_epilogue.cuh always stores all). For a staged
    // tile's last split, reduce_scatter_epilogue.cuh reads it as staged_count() << 1 | own_next().
    CUTLASS_HOST_DEVICE int32_t reduction_subtile_idx() const {
      return run() != 0 ? static_cast<int32_t>(staged_count() << 1 | (own_next() ? 1u : 0u)) : -1;
    }
  };
  static_assert(kMaxTailSplits < 16, "a split and the split count take four bits each in WorkTileInfo::bits");

  // ---- host side ----

  template <class ProblemShapeMNKL, class TileShape, class ClusterShape>
  static Params to_underlying_arguments(ProblemShapeMNKL problem_shape_mnkl, TileShape, ClusterShape,
                                        cutlass::KernelHardwareInfo const& hw_info, Arguments const& args,
                                        void* = nullptr, uint32_t = 1, uint32_t = 1) {
    return async_input_params<TileShape, ClusterShape>(problem_shape_mnkl, hw_info, args);
  }

  static bool can_implement(Arguments const& args) { return args.first_m_cluster >= 0 && args.band_m >= 1; }

  template <class ProblemShape, class ElementAccumulator>
  static size_t get_workspace_size(Arguments const&, ProblemShape, cutlass::KernelHardwareInfo const&, uint32_t,
                                   uint32_t = 1, uint32_t = 1) {
    return 0;
  }

  template <class ProblemShape, class ElementAccumulator>
  static cutlass::Status initialize_workspace(Arguments const&, void*, cudaStream_t, ProblemShape,
                                              cutlass::KernelHardwareInfo const&, uint32_t, uint32_t = 1,
                                              uint32_t = 1, cutlass::CudaHostAdapter* = nullptr) {
    return cutlass::Status::kSuccess;
  }

  // One cluster per co-resident slot (hw_info.max_active_clusters, from the occupancy query), no more
  // than there are cluster tiles. Clusters are laid along grid z; x and y span one cluster.
  template <class ProblemShapeMNK, class TileShape, class ClusterShape>
  static dim3 get_grid_shape(Params const& params, ProblemShapeMNK, TileShape, ClusterShape,
                             cutlass::KernelHardwareInfo hw_info, Arguments const&) {
    const int n = async_input_clusters(params, hw_info);
    return dim3(params.cluster_m, params.cluster_n, n > 0 ? n : 1);
  }

  // ---- device side ----

  CUTLASS_HOST_DEVICE AsyncInputTileScheduler() {}

  CUTLASS_DEVICE explicit AsyncInputTileScheduler(Params const& params) : params_(params) {
#if defined(__CUDA_ARCH__)
    current_ = static_cast<int32_t>(blockIdx.z);
    // The CTA's start goes in its first unit's record (tile_trace.h), not in a register of every thread.
    if (params.trace != nullptr && threadIdx.x == 0 && current_ < params.units) trace_now(params.trace, current_, kTraceStart);
#endif
  }

  // The producer warpgroup asks after the kernel's prologue (pipelines set up, cluster synchronized):
  // the mainloop producer's lane 0 marks the time in the CTA's first record. (The ping-pong kernel's
  // second consumer warpgroup has advanced one unit before it asks.)
  template <class ClusterShape>
  CUTLASS_DEVICE WorkTileInfo initial_work_tile_info(ClusterShape) {
#if defined(__CUDA_ARCH__)
    const WorkTileInfo work = get_current_work();
    if (params_.trace != nullptr && threadIdx.x == 0 && work.is_valid()) trace_now(params_.trace, work.unit, kTraceProducerStart);
    return work;
#else
    return WorkTileInfo::invalid_work_tile();
#endif
  }

  // The ping-pong kernel's walk (the cooperative one's is fetch_next_work): the producer takes every
  // unit of the CTA in turn, each consumer warpgroup every other one; a consumer warp that finds no
  // more work says so, once. A consumer warpgroup steps past the tile whose epilogue it ran by two
  // units (its one-unit step comes before its first tile), and its thread 0 records the tile.
  CUTLASS_DEVICE void advance_to_next_work(uint32_t advance_count = 1) {
#if defined(__CUDA_ARCH__)
    if (params_.trace != nullptr && advance_count > 1 && threadIdx.x >= cutlass::NumThreadsPerWarpGroup &&
        threadIdx.x % cutlass::NumThreadsPerWarpGroup == 0) {
      trace_epilogue_done(params_.trace, tile_of(params_, current_));
    }
#endif
    current_ += stride() * static_cast<int32_t>(advance_count);
  }

  CUTLASS_DEVICE WorkTileInfo get_current_work() const {
    const WorkTileInfo work = visit(WorkTileInfo::invalid_work_tile(), current_);
#if defined(__CUDA_ARCH__)
    if (params_.done != nullptr && !work.is_valid() && threadIdx.x >= cutlass::NumThreadsPerWarpGroup) signal_done();
#endif
    return work;
  }

  CUTLASS_DEVICE auto fetch_next_work(WorkTileInfo work) {
    // Consumer thread 0 (the first thread after the producer warpgroup) comes here after each epilogue.
    if (params_.trace != nullptr && threadIdx.x == cutlass::NumThreadsPerWarpGroup && work.is_valid()) {
      trace_epilogue_done(params_.trace, work);
    }
    const WorkTileInfo next = visit(work, work.unit + stride());
    if (params_.done != nullptr && !next.is_valid() && threadIdx.x >= cutlass::NumThreadsPerWarpGroup) signal_done();
    return cute::make_tuple(next, true);
  }

  template <class TileSchedulerPipeline, class TileSchedulerPipelineState>
  CUTLASS_DEVICE auto fetch_next_work(WorkTileInfo work, TileSchedulerPipeline&, TileSchedulerPipelineState) {
    return fetch_next_work(work);
  }

  CUTLASS_DEVICE bool is_last_tile(WorkTileInfo& work, uint32_t advance_count = 1) const {
    return !tile_of(params_, work.unit + stride() * static_cast<int32_t>(advance_count)).is_valid();
  }

  CUTLASS_HOST_DEVICE static bool valid_warpgroup_in_work_tile(WorkTileInfo const&) { return true; }
  CUTLASS_HOST_DEVICE static bool requires_separate_reduction(Params const&) { return false; }

  // Only a tile's last split stores it, and a staged reduce-scatter tile goes to the staging buffer
  // in fixup() instead, unless the epilogue stores it (reduce_in_epilogue).
  CUTLASS_HOST_DEVICE static bool compute_epilogue(WorkTileInfo const& work, Params const& params) {
    return work.split() + 1 == work.splits() && (!work.staged() || params.rs.reduce_in_epilogue);
  }

  // The consumer warpgroups, after a unit's mainloop: a split tile's partial sums meet in its last split.
  // Thread i of every split holds the same elements of the tile, so each thread hands over its own
  // registers through its own counter, and no thread waits for another of its CTA.
  template <class FrgTensorC>
  CUTLASS_DEVICE static void fixup(Params const& params, WorkTileInfo const& work, FrgTensorC& accumulators,
                                   uint32_t mma_warpgroups, uint32_t warpgroup) {
#if defined(__CUDA_ARCH__)
    const uint32_t threads = mma_warpgroups * cutlass::NumThreadsPerWarpGroup;
    const uint32_t thread = warpgroup * cutlass::NumThreadsPerWarpGroup + threadIdx.x % cutlass::NumThreadsPerWarpGroup;
    trace_mark(params, work, thread, kTraceFixupEnter);
    // One call of the reduce-scatter's part for both ways to a whole tile: with a call in each way, the
    // two inlined copies held the consumers over their register budget, and ptxas spilled the
    // mainloop's pipeline state (commit 0bb3b77).
    if (fixup_splits(params, work, accumulators, thread, threads)) {
      reduce_scatter_fixup(params, work, accumulators, thread, threads);
    }
    trace_mark(params, work, thread, kTraceFixupExit);
#endif
  }

  template <class ProblemShapeMNKL, class TileShape>
  CUTLASS_HOST_DEVICE static int get_work_k_tile_count(WorkTileInfo const& work, ProblemShapeMNKL, TileShape) {
    return work.k_count;
  }

  CUTLASS_HOST_DEVICE static uint32_t get_work_k_tile_start(WorkTileInfo const& work) {
    return static_cast<uint32_t>(work.k_begin);
  }

 private:
  // A consumer warp with no more work (done_signal.cuh).
  CUTLASS_DEVICE void signal_done() const { fused::signal_done(*params_.done, params_.rs); }

  CUTLASS_DEVICE static void trace_mark(Params const& params, WorkTileInfo const& work, uint32_t thread, int word) {
    if (params.trace != nullptr && thread == 0) trace_now(params.trace, work.unit, word);
  }

  // Whether the tile's accumulators are now whole (false: a split that handed its sums over;
  // tail_split_fixup.cuh).
  template <class FrgTensorC>
  CUTLASS_DEVICE static bool fixup_splits(Params const& params, WorkTileInfo const& work, FrgTensorC& accumulators,
                                          uint32_t thread, uint32_t threads) {
    return sum_tail_splits(work, [&] { return tail_slot_of(params, work); }, accumulators, params.counters,
                           params.partials, params.wait, thread, threads,
                           [&](int word) { trace_mark(params, work, thread, word); });
  }

  // The staged counter of the chunk a reduce-scatter tile's rows are in.
  CUTLASS_DEVICE static int32_t chunk_index(Params const& params, WorkTileInfo const& work) {
    return params.rs.staged_index(work.M_idx * params.tile_m, params.rank_rows_div, params.chunk_rows_div);
  }

  // Whether `other` is a whole staged tile of the same rank's rows and chunk as the staged tile `work`.
  CUTLASS_DEVICE static bool same_staged_chunk(Params const& params, WorkTileInfo const& work, WorkTileInfo const& other) {
    return other.is_valid() && other.staged() && other.splits() == 1 && chunk_index(params, other) == chunk_index(params, work);
  }

  // Whether the CTA's next tile with an epilogue, from `next` (the unit after a tile) on, is one of this
  // rank's own.
  CUTLASS_DEVICE bool own_tile_from(WorkTileInfo next) const {
    for (;; next = tile_of(params_, next.unit + stride())) {
      if (!next.is_valid()) return false;
      if (next.split() + 1 == next.splits()) return !next.staged();
    }
  }

  // Reduce-scatter, once a tile's accumulators are whole (reduce_scatter_fixup.cuh).
  template <class FrgTensorC>
  CUTLASS_DEVICE static void reduce_scatter_fixup(Params const& params, WorkTileInfo const& work,
                                                  FrgTensorC& accumulators, uint32_t thread, uint32_t threads) {
    fused::reduce_scatter_fixup<Element, kScaled>(params.rs, params.tile_m, params.rank_rows_div, params.chunk_rows_div,
                                                  work, accumulators, thread, threads, [&](int word) { trace_mark(params, work, thread, word); },
                                                  ScaleRowsThroughL1{params.rs, threads});
  }

  // This CTA's unit u, which follows `prev` (invalid for its first), as the kernel's loops get it; for
  // the consumers, a staged tile's last split also carries its run, and whether it releases it.
  //
  // The count: a release waits until the stores before it have reached L2, and every CTA stages at the
  // same moment of a round, so each one costs microseconds. Where this CTA's next tile is staged for
  // the same chunk, a whole staged tile leaves the count to it (the chunk is not complete before that
  // tile anyway), and the tile that ends such a run counts all of it; a split tile counts itself. The
  // run is carried from the tile before in its bits, found here once per tile rather than by a walk
  // back over the run: one tile_of() per staged tile, on the consumers' way from one epilogue to the
  // next mainloop. A run that would outgrow its bits is counted in parts (the copy engine waits for
  // the chunk's sum).
  CUTLASS_DEVICE WorkTileInfo visit(WorkTileInfo const& prev, int32_t u) const {
#if defined(__CUDA_ARCH__)
    const bool consumer = threadIdx.x >= cutlass::NumThreadsPerWarpGroup;
#else
    const bool consumer = false;
#endif
    WorkTileInfo w = tile_of(params_, u);
    if (!consumer || !w.staged() || w.split() + 1 != w.splits()) return w;
    const WorkTileInfo ahead = tile_of(params_, u + stride());
    // A staged tile that did not release is followed by a whole one of its chunk (its visit(), below).
    const uint32_t run = prev.run() != 0 && (prev.bits & WorkTileInfo::kReleases) == 0 ? prev.run() + 1 : 1u;
    const bool releases = w.splits() != 1 || run == WorkTileInfo::kMaxRun || !same_staged_chunk(params_, w, ahead);
    // Only the epilogue that stores staged tiles needs to know what comes next (its store pipeline).
    const bool own_next = params_.rs.reduce_in_epilogue && own_tile_from(ahead);
    w.bits |= (releases ? WorkTileInfo::kReleases : 0u) | (own_next ? WorkTileInfo::kOwnNext : 0u) | run << WorkTileInfo::kRunShift;
    return w;
  }

  // Work unit u: a whole cluster tile, or one split of a tail tile (tail tile u % tail, split u / tail,
  // so a tile's splits go to different clusters of the last round); without the consumers' run.
  CUTLASS_DEVICE static WorkTileInfo tile_of(Params const& params_, int32_t u) {
    if (u < 0 || u >= params_.units) return WorkTileInfo::invalid_work_tile();
    int32_t t = u, split = 0, tail_tile = 0;
    if (u >= params_.whole) {
      params_.tail_div(split, tail_tile, u - params_.whole);
      t = params_.whole + tail_tile;
    }
    int32_t band = 0, in_band = 0;
    params_.band_tiles_div(band, in_band, t);
    const int32_t band_row0 = band * params_.band_m;
    // Down the band's rows (fewer in the last band), then along N. A branch, not a reference to the
    // divisor chosen at run time: that put the scheduler's copy of Params in local memory and made
    // the kernel 8-15% slower (asynctp-rs-lab, docs/experiments.md).
    int32_t n_cluster = 0, row_in_band = 0;
    if (band_row0 == params_.last_band_row0) {
      params_.last_band_rows_div(n_cluster, row_in_band, in_band);
    } else {
      params_.band_rows_div(n_cluster, row_in_band, in_band);
    }
    int32_t m_cluster = band_row0 + row_in_band + params_.first_m_cluster;
    if (m_cluster >= params_.clusters_m) m_cluster -= params_.clusters_m;
    auto [cta_m, cta_n, cta_l] = cute::block_id_in_cluster();
    (void)cta_l;
    WorkTileInfo w;
    w.M_idx = m_cluster * params_.cluster_m + static_cast<int32_t>(cta_m);
    w.N_idx = n_cluster * params_.cluster_n + static_cast<int32_t>(cta_n);
    const int32_t splits = u >= params_.whole ? params_.splits : 1;
    w.k_begin = 0;
    w.k_count = params_.k_tiles;
    if (splits > 1) {  // 64-bit divisions, which a whole tile need not pay for
      w.k_begin = static_cast<int32_t>(static_cast<int64_t>(split) * params_.k_tiles / splits);
      w.k_count = static_cast<int32_t>(static_cast<int64_t>(split + 1) * params_.k_tiles / splits) - w.k_begin;
    }
    w.unit = u;
    const bool staged = params_.rs.is_staged(w.M_idx * params_.tile_m, params_.rank_rows_div);
    w.bits = static_cast<uint32_t>(split) | static_cast<uint32_t>(splits) << WorkTileInfo::kSplitsShift |
             (staged ? WorkTileInfo::kStaged : 0u);
    return w;
  }

  // A split tile's row in the workspace (its tail tile, and this CTA of the cluster).
  CUTLASS_DEVICE static int32_t tail_slot_of(Params const& params, WorkTileInfo const& work) {
    int32_t split = 0, tail_tile = 0;
    params.tail_div(split, tail_tile, work.unit - params.whole);
    auto [cta_m, cta_n, cta_l] = cute::block_id_in_cluster();
    (void)cta_l;
    return tail_tile * params.cluster_m * params.cluster_n + static_cast<int32_t>(cta_m) +
           static_cast<int32_t>(cta_n) * params.cluster_m;
  }

  // Units are dealt to the clusters in turn, one per cluster of the grid.
  CUTLASS_DEVICE static int32_t stride() {
#if defined(__CUDA_ARCH__)
    return static_cast<int32_t>(gridDim.z);
#else
    return 1;
#endif
  }

  Params params_;
  int32_t current_ = 0;  // the ping-pong kernel's unit (advance_to_next_work); unused by the cooperative one
};

}  // namespace asynctp::kernels::fused

namespace cutlass::gemm::kernel::detail {

// Lets GemmUniversal<..., asynctp::kernels::fused::AsyncInputSchedule> find the scheduler.
template <class Element, bool kScaled, class ArchTag, class TileShape, class ClusterShape, uint32_t kStages>
struct TileSchedulerSelector<asynctp::kernels::fused::AsyncInputSchedule<Element, kScaled>, ArchTag, TileShape,
                             ClusterShape, kStages> {
  using Scheduler = asynctp::kernels::fused::AsyncInputTileScheduler<Element, kScaled>;
};

}  // namespace cutlass::gemm::kernel::detail
