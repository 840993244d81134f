// A persistent tile scheduler for a GEMM whose A rows arrive chunk by chunk (the fused all-gather).
//
// It plugs into CUTLASS's Hopper warp-specialized kernels in place of PersistentTileSchedulerSm90 (the
// kernel picks it through TileSchedulerSelector and the AsyncInputSchedule tag). What it changes is the
// order of the output tiles only:
//  - each persistent cluster walks cluster tiles t = cluster_id, cluster_id + clusters, ...;
//  - t maps to rows of cluster tiles in order, starting at `first_m_cluster` (the first cluster row
//    that starts inside this rank's own shard) and wrapping around, so the local rows, which need no
//    communication, are multiplied first and each peer's rows follow in the order they arrive (the
//    peers push in rank order after this rank; docs/fused.md);
//  - within a band of `band_m` cluster rows it goes down the rows before moving along N (band_m = 1:
//    row by row), which trades A reuse for B reuse in L2.
// Walking in that rotated order makes the rows a tile needs non-decreasing in arrival time, so a
// cluster that waits for a chunk never holds up one that could run. The waiting itself is the
// mainloop's job (async_input_mainloop.cuh), which keeps this a scheduler and nothing else.
//
// No split-K, no stream-K, no workspace: one CTA computes each output tile whole.
#pragma once

#include <cute/arch/cluster_sm90.hpp>
#include <cute/tensor.hpp>
#include <cutlass/gemm/kernel/tile_scheduler.hpp>
#include <cutlass/kernel_hardware_info.hpp>
#include <cutlass/pipeline/pipeline.hpp>

namespace asynctp::kernels::fused {

// Tag that selects AsyncInputTileScheduler in cutlass::gemm::kernel::GemmUniversal.
struct AsyncInputSchedule {};

class AsyncInputTileScheduler {
 public:
  // The kernel refers to these names when it sizes its launch; the raster is fixed (see above).
  enum class RasterOrder { AlongM, AlongN };
  enum class RasterOrderOptions { Heuristic, AlongM, AlongN };
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

  struct Arguments {
    int max_swizzle_size = 1;  // read by the kernel's get_grid_shape; unused here
    RasterOrderOptions raster_order = RasterOrderOptions::AlongN;
    int first_m_cluster = 0;  // cluster row visited first
    int band_m = 1;           // cluster rows walked down before moving along N
  };

  struct Params {
    int log_swizzle_size_ = 0;                      // names the kernel reads
    RasterOrder raster_order_ = RasterOrder::AlongN;
    int32_t clusters_m = 0, clusters_n = 0;         // cluster tiles along M and N
    int32_t cluster_m = 1, cluster_n = 1;           // CTAs per cluster along M and N
    int32_t first_m_cluster = 0;
    int32_t band_m = 1;
    int32_t total = 0;                              // clusters_m * clusters_n
  };

  struct WorkTileInfo {
    int32_t M_idx = 0;
    int32_t N_idx = 0;
    int32_t L_idx = 0;
    bool is_valid_tile = false;
    CUTLASS_HOST_DEVICE bool is_valid() const { return is_valid_tile; }
    CUTLASS_HOST_DEVICE static WorkTileInfo invalid_work_tile() { return {-1, -1, -1, false}; }
    CUTLASS_HOST_DEVICE bool is_final_split(uint32_t) const { return true; }
    CUTLASS_HOST_DEVICE int32_t reduction_subtile_idx() const { return -1; }
  };

  // ---- host side ----

  template <class ProblemShapeMNKL, class TileShape, class ClusterShape>
  static Params to_underlying_arguments(ProblemShapeMNKL problem_shape_mnkl, TileShape, ClusterShape,
                                        cutlass::KernelHardwareInfo const&, Arguments const& args, void* = nullptr,
                                        uint32_t = 1, uint32_t = 1) {
    static_assert(cute::is_static<TileShape>::value && cute::is_static<ClusterShape>::value,
                  "AsyncInputTileScheduler needs compile-time tile and cluster shapes");
    Params p;
    p.cluster_m = cute::size<0>(ClusterShape{});
    p.cluster_n = cute::size<1>(ClusterShape{});
    const int tiles_m = static_cast<int>(cute::ceil_div(cute::get<0>(problem_shape_mnkl), cute::get<0>(TileShape{})));
    const int tiles_n = static_cast<int>(cute::ceil_div(cute::get<1>(problem_shape_mnkl), cute::get<1>(TileShape{})));
    p.clusters_m = (tiles_m + p.cluster_m - 1) / p.cluster_m;
    p.clusters_n = (tiles_n + p.cluster_n - 1) / p.cluster_n;
    p.total = p.clusters_m * p.clusters_n;
    p.first_m_cluster = p.clusters_m > 0 ? args.first_m_cluster % p.clusters_m : 0;
    p.band_m = args.band_m < 1 ? 1 : args.band_m;
    return p;
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
    const int cluster_size = params.cluster_m * params.cluster_n;
    int slots = hw_info.max_active_clusters > 0 ? hw_info.max_active_clusters : hw_info.sm_count / cluster_size;
    if (slots < 1) slots = 1;
    const int clusters = params.total < slots ? params.total : slots;
    return dim3(params.cluster_m, params.cluster_n, clusters > 0 ? clusters : 1);
  }

  // ---- device side ----

  CUTLASS_HOST_DEVICE AsyncInputTileScheduler() {}

  CUTLASS_DEVICE explicit AsyncInputTileScheduler(Params const& params) : params_(params) {
#if defined(__CUDA_ARCH__)
    current_ = static_cast<int32_t>(blockIdx.z);
    stride_ = static_cast<int32_t>(gridDim.z);
#endif
  }

  template <class ClusterShape>
  CUTLASS_DEVICE WorkTileInfo initial_work_tile_info(ClusterShape) const {
    return work_for(current_);
  }

  CUTLASS_DEVICE WorkTileInfo get_current_work() const { return work_for(current_); }

  CUTLASS_DEVICE auto fetch_next_work(WorkTileInfo) {
    current_ += stride_;
    return cute::make_tuple(work_for(current_), true);
  }

  template <class TileSchedulerPipeline, class TileSchedulerPipelineState>
  CUTLASS_DEVICE auto fetch_next_work(WorkTileInfo work, TileSchedulerPipeline&, TileSchedulerPipelineState) {
    return fetch_next_work(work);
  }

  CUTLASS_DEVICE bool is_last_tile(WorkTileInfo&, uint32_t advance_count = 1) const {
    return !work_for(current_ + stride_ * static_cast<int32_t>(advance_count)).is_valid();
  }

  CUTLASS_HOST_DEVICE static bool valid_warpgroup_in_work_tile(WorkTileInfo const&) { return true; }
  CUTLASS_HOST_DEVICE static bool requires_separate_reduction(Params const&) { return false; }
  CUTLASS_HOST_DEVICE static bool compute_epilogue(WorkTileInfo const&, Params const&) { return true; }

  template <class FrgTensorC>
  CUTLASS_DEVICE static void fixup(Params const&, WorkTileInfo const&, FrgTensorC&, uint32_t, uint32_t) {}

  template <class ProblemShapeMNKL, class TileShape>
  CUTLASS_HOST_DEVICE static int get_work_k_tile_count(WorkTileInfo const&, ProblemShapeMNKL problem_shape,
                                                       TileShape tile_shape) {
    return static_cast<int>(cute::ceil_div(cute::get<2>(problem_shape), cute::get<2>(tile_shape)));
  }

  CUTLASS_HOST_DEVICE static uint32_t get_work_k_tile_start(WorkTileInfo const&) { return 0; }

 private:
  // Cluster tile t: the band of band_m cluster rows it falls in, then down the band's rows first.
  CUTLASS_DEVICE WorkTileInfo work_for(int32_t t) const {
    if (t >= params_.total) return WorkTileInfo::invalid_work_tile();
    const int32_t band_tiles = params_.band_m * params_.clusters_n;
    const int32_t band = t / band_tiles;
    const int32_t in_band = t - band * band_tiles;
    const int32_t band_row0 = band * params_.band_m;
    const int32_t rows = min(params_.band_m, params_.clusters_m - band_row0);
    const int32_t n_cluster = in_band / rows;
    int32_t m_cluster = band_row0 + (in_band - n_cluster * rows) + params_.first_m_cluster;
    if (m_cluster >= params_.clusters_m) m_cluster -= params_.clusters_m;
    auto [cta_m, cta_n, cta_l] = cute::block_id_in_cluster();
    (void)cta_l;
    return {m_cluster * params_.cluster_m + static_cast<int32_t>(cta_m),
            n_cluster * params_.cluster_n + static_cast<int32_t>(cta_n), 0, true};
  }

  Params params_;
  int32_t current_ = 0;
  int32_t stride_ = 1;
};

}  // namespace asynctp::kernels::fused

namespace cutlass::gemm::kernel::detail {

// Lets GemmUniversal<..., asynctp::kernels::fused::AsyncInputSchedule> find the scheduler.
template <class ArchTag, class TileShape, class ClusterShape, uint32_t SchedulerPipelineStageCount>
struct TileSchedulerSelector<asynctp::kernels::fused::AsyncInputSchedule, ArchTag, TileShape, ClusterShape,
                             SchedulerPipelineStageCount> {
  using Scheduler = asynctp::kernels::fused::AsyncInputTileScheduler;
};

}  // namespace cutlass::gemm::kernel::detail
