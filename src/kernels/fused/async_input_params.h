// The fused GEMM's tile scheduler (async_input_scheduler.cuh) as the host sets it up: the arguments
// the op gives it, and the Params it derives from them, the problem and the GPU (tile counts, the
// band walk's divisors, the last round's split along K, the reduce-scatter's rows).
#pragma once

#include <algorithm>
#include <cstdint>

#include <cute/tensor.hpp>
#include <cutlass/fast_math.h>
#include <cutlass/kernel_hardware_info.hpp>

#include "kernels/fused/done_signal.cuh"
#include "kernels/fused/reduce_scatter_tiles.h"
#include "kernels/fused/tail_split.h"
#include "kernels/wait_context.h"

namespace asynctp::kernels::fused {

// The names CUTLASS's kernel reads when it sizes its launch; the raster is fixed (the scheduler's
// order: async_input_scheduler.cuh).
enum class AsyncInputRasterOrder { AlongM, AlongN };
enum class AsyncInputRasterOrderOptions { Heuristic, AlongM, AlongN };

struct AsyncInputArguments {
  int max_swizzle_size = 1;  // read by the kernel's get_grid_shape; unused here
  AsyncInputRasterOrderOptions raster_order = AsyncInputRasterOrderOptions::AlongN;
  int first_m_cluster = 0;  // cluster row visited first
  int band_m = 1;           // cluster rows walked down before moving along N
  // tail_split_workspace_bytes(workspace_sms) bytes, counters zero; null: no tile is split.
  void* workspace = nullptr;
  int workspace_sms = 0;
  int max_splits = kMaxTailSplits;
  asynctp::kernels::WaitContext wait{};  // bounds the last split's wait for the others
  ReduceScatterTiles rs{};                // rs.rank >= 0: the partial product of a reduce-scatter
  uint64_t* trace = nullptr;              // tile_trace.h; null: off
  const DoneSignal* done = nullptr;       // device memory; non-null: the last consumer warp signals the peers
};

struct AsyncInputParams {
  int log_swizzle_size_ = 0;                      // names the kernel reads
  AsyncInputRasterOrder raster_order_ = AsyncInputRasterOrder::AlongN;
  int32_t clusters_m = 0, clusters_n = 0;         // cluster tiles along M and N
  int32_t cluster_m = 1, cluster_n = 1;           // CTAs per cluster along M and N
  int32_t first_m_cluster = 0;
  int32_t band_m = 1;
  int32_t total = 0;                              // clusters_m * clusters_n
  int32_t whole = 0, tail = 0, splits = 1;        // tail_split.h
  int32_t units = 0;                              // whole + tail * splits
  int32_t k_tiles = 0;                            // steps along K of a whole tile
  uint32_t* counters = nullptr;                   // [tail tile * CTAs per cluster + CTA][consumer thread]
  float* partials = nullptr;                      // [counters' row * (splits - 1) + split][group of 4][thread]
  asynctp::kernels::WaitContext wait{};
  int32_t tile_m = 0;                             // rows of a CTA's tile
  ReduceScatterTiles rs{};
  uint64_t* trace = nullptr;
  const DoneSignal* done = nullptr;  // a pointer, not the struct: the scheduler keeps Params in every thread
  // tile_of()'s divisors, as multiply-and-shift: every consumer thread finds one or two tiles between
  // one tile's epilogue and the next one's mainloop, and an integer division is a few dozen dependent
  // instructions. Bands (band_m * clusters_n tiles; band_m rows, last_band_rows in the last band),
  // the tail's tiles, and the reduce-scatter's rows per rank and per chunk.
  cutlass::FastDivmod band_tiles_div, band_rows_div, last_band_rows_div, tail_div, rank_rows_div, chunk_rows_div;
  int32_t last_band_row0 = 0;
};

// Co-resident cluster slots: hw_info.max_active_clusters, from the occupancy query.
inline int async_input_slots(AsyncInputParams const& p, cutlass::KernelHardwareInfo const& hw_info) {
  const int cluster_size = p.cluster_m * p.cluster_n;
  const int slots = hw_info.max_active_clusters > 0 ? hw_info.max_active_clusters : hw_info.sm_count / cluster_size;
  return slots < 1 ? 1 : slots;
}

// Clusters in the grid: one per slot, no more than there are units of work (cluster tiles, a split
// tile counting once per split).
inline int async_input_clusters(AsyncInputParams const& p, cutlass::KernelHardwareInfo const& hw_info) {
  const int slots = async_input_slots(p, hw_info);
  return p.units < slots ? p.units : slots;
}

// The scheduler's Params for a problem of `problem_shape_mnkl` in tiles of TileShape and clusters of
// ClusterShape, on the GPU `hw_info` describes.
template <class TileShape, class ClusterShape, class ProblemShapeMNKL>
AsyncInputParams async_input_params(ProblemShapeMNKL problem_shape_mnkl, cutlass::KernelHardwareInfo const& hw_info,
                                    AsyncInputArguments const& args) {
  static_assert(cute::is_static<TileShape>::value && cute::is_static<ClusterShape>::value,
                "AsyncInputTileScheduler needs compile-time tile and cluster shapes");
  AsyncInputParams p;
  p.cluster_m = cute::size<0>(ClusterShape{});
  p.cluster_n = cute::size<1>(ClusterShape{});
  const int tiles_m = static_cast<int>(cute::ceil_div(cute::get<0>(problem_shape_mnkl), cute::get<0>(TileShape{})));
  const int tiles_n = static_cast<int>(cute::ceil_div(cute::get<1>(problem_shape_mnkl), cute::get<1>(TileShape{})));
  p.clusters_m = (tiles_m + p.cluster_m - 1) / p.cluster_m;
  p.clusters_n = (tiles_n + p.cluster_n - 1) / p.cluster_n;
  p.total = p.clusters_m * p.clusters_n;
  p.first_m_cluster = p.clusters_m > 0 ? args.first_m_cluster % p.clusters_m : 0;
  p.band_m = args.band_m < 1 ? 1 : args.band_m;
  p.k_tiles = static_cast<int32_t>(cute::ceil_div(cute::get<2>(problem_shape_mnkl), cute::get<2>(TileShape{})));
  p.whole = p.units = p.total;
  p.wait = args.wait;
  p.tile_m = cute::get<0>(TileShape{});
  p.rs = args.rs;
  p.trace = args.trace;
  p.done = args.done;
  const int32_t bands = (p.clusters_m + p.band_m - 1) / p.band_m;
  p.last_band_row0 = bands > 0 ? (bands - 1) * p.band_m : 0;
  p.band_tiles_div = cutlass::FastDivmod(std::max(1, p.band_m * p.clusters_n));
  p.band_rows_div = cutlass::FastDivmod(p.band_m);
  p.last_band_rows_div = cutlass::FastDivmod(std::max(1, p.clusters_m - p.last_band_row0));
  p.rank_rows_div = cutlass::FastDivmod(std::max(1, p.rs.rows_per_rank));
  p.chunk_rows_div = cutlass::FastDivmod(std::max(1, p.rs.rows_per_chunk));
  // Planned on every slot, not on the clusters the tiles alone would fill: a problem of less than one
  // round (small M) is then all tail, and its tiles split along K over the idle slots.
  const TailSplit split = plan_tail_split(p.total, async_input_slots(p, hw_info), p.k_tiles, args.max_splits);
  const int64_t ctas = static_cast<int64_t>(p.cluster_m) * p.cluster_n;
  // Room for the plan's counters and partial sums (a workspace sized for fewer SMs has none).
  const bool fits = split.tail * ctas <= args.workspace_sms && split.tail * ctas * (split.splits - 1) <= args.workspace_sms;
  if (args.workspace != nullptr && split.splits > 1 && fits) {
    p.whole = static_cast<int32_t>(split.whole);
    p.tail = static_cast<int32_t>(split.tail);
    p.splits = static_cast<int32_t>(split.splits);
    p.units = static_cast<int32_t>(split.units());
    p.tail_div = cutlass::FastDivmod(p.tail);
    p.counters = static_cast<uint32_t*>(args.workspace);
    p.partials = reinterpret_cast<float*>(p.counters + static_cast<size_t>(args.workspace_sms) * kConsumerThreads);
  }
  return p;
}

}  // namespace asynctp::kernels::fused
