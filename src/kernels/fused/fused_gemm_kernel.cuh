// The fused GEMM assembled from CUTLASS 3 parts, and its host launch. Included by one
// generated .cu file per instantiation (fused_gemm_instances.h).
//
// The kernel is CUTLASS's Hopper warp-specialized cooperative GEMM (one producer warpgroup issuing
// TMA loads, two consumer warpgroups issuing WGMMA on a 128 x kTileN tile 128 bytes deep, a TMA epilogue) with two of
// our chunks in it: the async-input mainloop (waits for a tile's rows, reads the local shard in
// place) and the async-input tile scheduler (own rows first), launched in 2x1x1 clusters, or 1x1x1 for
// problems of one tile row (docs/performance.md has its figures beside cuBLAS).
// The two-rank reduce-scatter's instantiations (kReduceInEpilogue) also take a source C and wrap the
// epilogue in reduce_scatter_epilogue.cuh; fp8's with row-wise scales (kRowScales) apply them in the
// epilogue (row_scale_epilogue.cuh). Problems of a few rounds of tiles run CUTLASS's ping-pong kernel
// instead (kPingpong: a tile per consumer warpgroup, 128 wide), the reduce-scatter's reduced in its
// epilogue (pingpong_epilogue.cuh).
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/kernel_hardware_info.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <vector>
#include <type_traits>

#include "common/check.h"
#include "common/driver_api.h"
#include "kernels/fused/fused_gemm.h"
#include "kernels/fused/async_input_mainloop.cuh"
#include "kernels/fused/async_input_scheduler.cuh"
#include "kernels/fused/fp8_fusions.cuh"
#include "kernels/fused/launch_key.h"
#include "kernels/fused/packed_stride.h"
#include "kernels/fused/pingpong_epilogue.cuh"
#include "kernels/fused/reduce_scatter_epilogue.cuh"
#include "kernels/fused/row_scale_epilogue.cuh"
#include "kernels/fused/row_window_epilogue.cuh"

#if !defined(NDEBUG)
// Without NDEBUG, CUTLASS's device asserts turn WGMMA sequences into function calls that ptxas must
// serialize (warning C7510), which costs 5-10% of throughput.
#error "build the fused kernels with -DNDEBUG (CMake does this for them)"
#endif

namespace asynctp::kernels::fused {

template <Element kElement>
using CutlassElement = std::conditional_t<
    kElement == Element::kBF16, cutlass::bfloat16_t,
    std::conditional_t<kElement == Element::kFP16, cutlass::half_t, cutlass::float_e4m3_t>>;
// The product's element by default: the inputs', but bf16 for fp8 inputs (which may also give fp16).
template <class Element>
using ProductElement = std::conditional_t<sizeof(Element) == 1, cutlass::bfloat16_t, Element>;
// asynctp's kRowMajor B is [K, N] with N contiguous: CUTLASS's RowMajor B. kColMajor ([N, K]) is its ColumnMajor.
template <Layout kLayoutB>
using CutlassLayoutB =
    std::conditional_t<kLayoutB == Layout::kRowMajor, cutlass::layout::RowMajor, cutlass::layout::ColumnMajor>;

// kClusterM: CTAs per cluster along M, sharing B's loads (2), or one (a problem of one tile row, where a
// second CTA along M would have no rows, and a reduce-scatter's of an odd number of tile rows a rank,
// where it would hold two ranks' rows: fused_gemm_instances.h). kRowScales: fp8 with row-wise
// scales, applied by the epilogue (FusedGemmArgs::row_scales). Out: the product's element, bf16 or
// fp16 for fp8 inputs (FusedGemmArgs::out), the inputs' otherwise.
template <class Element, class LayoutB, int kTileN, bool kReduceInEpilogue = false, int kClusterM = 2,
          bool kRowScales = false, bool kPingpong = false, class Out = ProductElement<Element>>
struct FusedGemmKernel {
  using TileShape = cute::Shape<cute::_128, cute::Int<kTileN>, cute::Int<static_cast<int>(kTileKBytes / sizeof(Element))>>;
  using ClusterShape = cute::Shape<cute::Int<kClusterM>, cute::_1, cute::_1>;
  static constexpr int64_t kRowsPerCluster = kTileRows * kClusterM;  // the scheduler's unit of order
  static_assert(kClusterM == 2 || (kClusterM == 1 && !kReduceInEpilogue),
                "one-CTA clusters are for problems of one tile row, and a reduce-scatter's reduced in fixup()");
  // fp8: the scaled op's instantiations, the only ones with scales and a bias.
  static constexpr bool kScaled = sizeof(Element) == 1;
  using ElementD = Out;
  static_assert(kScaled ? sizeof(Out) == 2 : std::is_same_v<Out, Element>,
                "16-bit inputs give their own type, fp8 inputs a 16-bit one");
  static constexpr int kAlign = 16 / sizeof(Element);    // elements per 16 bytes: what TMA needs
  static constexpr int kAlignD = 16 / sizeof(ElementD);
  static_assert(cute::size<0>(TileShape{}) == kTileRows, "kTileRows (tile_shape.h) must match the tile's M");
  static_assert(!kReduceInEpilogue || kTileN == kRsTileN, "a reduce-scatter's tiles are kRsTileN wide");
  static_assert(!kRowScales || (kScaled && !kReduceInEpilogue), "row-wise scales are the all-gather's fp8");
  static_assert(!kPingpong || (kClusterM == 2 && !kReduceInEpilogue),
                "the ping-pong schedule runs 2 x 1 clusters, and a reduce-scatter's reduces in its own epilogue");
  // The ping-pong schedule's instantiations but the row-wise one also run the reduce-scatter
  // (pingpong_epilogue.cuh); their epilogue then holds its parameters, as kReduceInEpilogue's does.
  static constexpr bool kPingpongRs = kPingpong && !kRowScales;
  static constexpr bool kEpilogueRs = kReduceInEpilogue || kPingpongRs;

  // D = alpha * A @ B, or with a source (the reduce-scatter's peer copy) D = alpha * A @ B + beta * C.
  // With C, CUTLASS reuses C's shared memory for D: 33 KB against 17 KB, which still leaves the
  // mainloop its four stages.
  using LinearCombination = cutlass::epilogue::fusion::LinearCombination<ElementD, float, ElementD, float>;
  // fp8: D = alpha * A @ B + bias[n], or with row-wise scales in the ping-pong schedule
  // D = col_scales[n] * (row_scales[m] * acc) + bias[n] (fp8_fusions.cuh).
  using TensorWiseBias = fused::TensorWiseBias<ElementD, TileShape>;
  using RowScaled = fused::RowScaled<ElementD, TileShape>;
  using PlainFusion = std::conditional_t<kScaled, TensorWiseBias, LinearCombination>;
  template <class ElementC, class Fusion = PlainFusion, class EpilogueTile = cutlass::epilogue::collective::EpilogueTileAuto>
  using BuiltEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      EpilogueTile, float, float,
      ElementC, cutlass::layout::RowMajor, kAlignD,
      ElementD, cutlass::layout::RowMajor, kAlignD,
      std::conditional_t<kPingpong, cutlass::epilogue::TmaWarpSpecialized, cutlass::epilogue::TmaWarpSpecializedCooperative>,
      Fusion>::CollectiveOp;
  static constexpr bool kRowScaleInRegisters = kRowScales && !kPingpong;
  using RowScaledEpilogue = std::conditional_t<kPingpong, RowWindowEpilogue<BuiltEpilogue<void, RowScaled>>,
                                               RowScaleEpilogue<RowWindowEpilogue<BuiltEpilogue<void>>>>;
  using Epilogue = std::conditional_t<
      kReduceInEpilogue,
      ReduceScatterEpilogue<BuiltEpilogue<ElementD, LinearCombination>, BuiltEpilogue<void, LinearCombination>>,
      std::conditional_t<kRowScales, RowScaledEpilogue,
                         std::conditional_t<kPingpongRs, PingpongEpilogue<BuiltEpilogue<void>, kScaled>,
                                            RowWindowEpilogue<BuiltEpilogue<void>>>>>;

  // fp8 accumulates fast (WGMMA's own accumulation, no promotion to a second set of fp32
  // registers): with the promotion, 128 x 256 tiles spill 1.8 KB of registers a thread.
  // kPingpong: each consumer warpgroup holds a whole tile of its own, and one's epilogue runs while the
  // other's mainloop does (CUTLASS's ping-pong kernel).
  using MainloopSchedule = std::conditional_t<
      kScaled,
      std::conditional_t<kPingpong, cutlass::gemm::KernelTmaWarpSpecializedPingpongFP8FastAccum,
                         cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8FastAccum>,
      std::conditional_t<kPingpong, cutlass::gemm::KernelTmaWarpSpecializedPingpong,
                         cutlass::gemm::KernelTmaWarpSpecializedCooperative>>;
  using BaseMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
      Element, cutlass::layout::RowMajor, kAlign,
      Element, LayoutB, kAlign,
      float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      MainloopSchedule>::CollectiveOp;
  using Mainloop = AsyncInputMainloop<BaseMainloop>;

  // The scheduler's element is what it stages and reduces: the product's. It scales an fp8 reduce-scatter's
  // tiles, which the row-wise instantiations do not run: they compile none of that.
  using Kernel = cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, Mainloop, Epilogue,
                                                      AsyncInputSchedule<ElementD, kScaled && !kRowScales>>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};

namespace detail {

// SM count and co-resident clusters of `Kernel` on the current device, asked once per device.
template <class Kernel>
cutlass::KernelHardwareInfo hardware_info() {
  static std::mutex mu;
  static int cached_device = -1;
  static cutlass::KernelHardwareInfo cached;
  int device = 0;
  ASYNCTP_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mu);
  if (device != cached_device) {
    cached = cutlass::KernelHardwareInfo::make_kernel_hardware_info<Kernel>(device);
    cached_device = device;
  }
  return cached;
}

// The kernel's driver handle on the current device (the launch below goes through the driver).
template <class Kernel>
CUfunction kernel_function() {
  CUfunction fn = nullptr;
  ASYNCTP_CUDA_CHECK(cudaGetFuncBySymbol(&fn, reinterpret_cast<const void*>(cutlass::device_kernel<Kernel>)));
  return fn;
}

// Launches `gemm`'s kernel (`fn`, from kernel_function) with the parameters it was initialized with.
// CUTLASS's own run() also sets the kernel's non-portable-cluster attribute on every launch, an API
// call that the host makes while the GPU waits for the kernel (a fused call starts with an idle GPU
// as often as not); a 2-CTA cluster is portable, so that attribute is not needed at all. The driver's
// cuLaunchKernelEx, not the runtime's cudaLaunchKernelExC: for this kernel the runtime's took 7.5-7.7 us
// of host time against the driver's 5.3 (docs/design/fused_all_gather_matmul.md, "Host cost").
template <class ClusterShape, bool kEpilogueRs, class Gemm>
void launch_on_clusters(const Gemm& gemm, CUfunction fn, uint32_t begin_epoch, cudaStream_t stream) {
  using Kernel = typename Gemm::GemmKernel;
  typename Kernel::Params params = gemm.params();
  params.scheduler.rs.begin_epoch = begin_epoch;  // changes every call; kept parameters leave it out
  if constexpr (kEpilogueRs) params.epilogue.rs.begin_epoch = begin_epoch;
  CUlaunchAttribute cluster;
  cluster.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
  cluster.value.clusterDim.x = cute::size<0>(ClusterShape{});
  cluster.value.clusterDim.y = cute::size<1>(ClusterShape{});
  cluster.value.clusterDim.z = cute::size<2>(ClusterShape{});
  const dim3 grid = Gemm::get_grid_shape(params), block = Kernel::get_block_shape();
  CUlaunchConfig config = {};
  config.gridDimX = grid.x, config.gridDimY = grid.y, config.gridDimZ = grid.z;
  config.blockDimX = block.x, config.blockDimY = block.y, config.blockDimZ = block.z;
  config.sharedMemBytes = Kernel::SharedStorageSize;
  config.hStream = reinterpret_cast<CUstream>(stream);
  config.attrs = &cluster;
  config.numAttrs = 1;
  void* args[] = {&params};
  ASYNCTP_CU_CHECK(asynctp::detail::driver().launch_kernel_ex(&config, fn, args, nullptr));
}

}  // namespace detail

template <class Element, class LayoutB, int kTileN, bool kReduceInEpilogue = false, int kClusterM = 2,
          bool kRowScales = false, bool kPingpong = false, class Out = ProductElement<Element>>
void load_fused_gemm() {
  using Kernel =
      typename FusedGemmKernel<Element, LayoutB, kTileN, kReduceInEpilogue, kClusterM, kRowScales, kPingpong, Out>::Kernel;
  (void)detail::hardware_info<Kernel>();  // the occupancy query loads the kernel
  ASYNCTP_CUDA_CHECK(cudaFuncSetAttribute(cutlass::device_kernel<Kernel>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(Kernel::SharedStorageSize)));
}

// CUTLASS's arguments for one launch.
template <class Element, class LayoutB, int kTileN, bool kReduceInEpilogue, int kClusterM, bool kRowScales,
          bool kPingpong, class Out>
typename FusedGemmKernel<Element, LayoutB, kTileN, kReduceInEpilogue, kClusterM, kRowScales, kPingpong, Out>::Gemm::Arguments
cutlass_arguments(const FusedGemmArgs& a) {
  using K = FusedGemmKernel<Element, LayoutB, kTileN, kReduceInEpilogue, kClusterM, kRowScales, kPingpong, Out>;
  using Kernel = typename K::Kernel;
  using ElementD = typename K::ElementD;
  static_assert(kClusterM != 2 || K::kRowsPerCluster == kClusterRows,
                "kClusterRows (tile_shape.h) must match the tile and cluster shape");
  constexpr int64_t kRows = K::kRowsPerCluster;

  typename K::Gemm::Arguments args{};
  args.mode = cutlass::gemm::GemmUniversalMode::kGemm;
  args.problem_shape = {static_cast<int>(a.M), static_cast<int>(a.N), static_cast<int>(a.K), 1};

  auto& ml = args.mainloop;
  ml.gathered.ptr_A = static_cast<const Element*>(a.a);
  ml.gathered.dA = packed_stride<typename Kernel::StrideA>(a.M, a.K);
  ml.gathered.ptr_B = static_cast<const Element*>(a.b);
  ml.gathered.dB = packed_stride<typename Kernel::StrideB>(a.N, a.K);
  if (a.a_local != nullptr && a.local_end > a.local_begin) {
    ml.ptr_A_local = static_cast<const Element*>(a.a_local);  // rows [local_begin, local_end) of A
    ml.local_begin = static_cast<int32_t>(a.local_begin);
    ml.local_end = static_cast<int32_t>(a.local_end);
  }
  ml.chunks = a.chunks;

  if constexpr (kReduceInEpilogue) {
    // Own tiles: D = alpha * (A @ B + the peer's copy), both addressed as this rank's m rows alone.
    // Staged tiles: the partial product as it is, addressed as the peer's m rows alone, into the
    // staging buffer's slot of the peer (laid out like the product), or pushed from the kernel, into
    // the peer's inbox at this rank's slot. (reduce_scatter_epilogue.cuh)
    const ReduceScatterTiles& rs = a.rs;
    const int64_t m = rs.rows_per_rank;
    auto& own = args.epilogue.own;
    own.thread.alpha = a.alpha;
    own.thread.beta = a.alpha;
    own.ptr_C = reinterpret_cast<const ElementD*>(rs.inbox) + (1 - rs.rank) * m * a.N;
    own.dC = packed_stride<typename Kernel::StrideC>(m, a.N);
    own.ptr_D = static_cast<ElementD*>(a.c);
    own.dD = packed_stride<typename Kernel::StrideD>(m, a.N);
    own.row0 = static_cast<int32_t>(a.c_row0);
    own.rows = static_cast<int32_t>(m);
    auto& staged = args.epilogue.staged;
    staged.thread.alpha = 1.0f;
    staged.thread.beta = 0.0f;
    staged.ptr_C = nullptr;
    const int64_t peer = 1 - rs.rank;
    staged.ptr_D = rs.push_inbox != nullptr ? reinterpret_cast<ElementD*>(rs.push_inbox)
                                            : reinterpret_cast<ElementD*>(rs.staging) + peer * m * a.N;
    staged.dD = packed_stride<typename Kernel::StrideD>(m, a.N);
    staged.row0 = static_cast<int32_t>(peer * m);
    staged.rows = static_cast<int32_t>(m);
    args.epilogue.rs = rs;
  } else {
    // c holds rows [c_row0, c_row0 + rows) of the product: a reduce-scatter's rank's rows, or all.
    const int64_t rows = a.rs.rank >= 0 ? a.rs.rows_per_rank : a.M - a.c_row0;
    if constexpr (K::kRowScaleInRegisters) {
      args.epilogue.thread = tensor_wise_bias<ElementD, typename K::TileShape>(1.0f, nullptr, a.bias);
      args.epilogue.row_scales = a.row_scales;
      args.epilogue.col_scales = a.col_scales;
      args.epilogue.chunks = a.chunks;
      args.epilogue.local_begin = static_cast<int32_t>(ml.local_begin);
      args.epilogue.local_end = static_cast<int32_t>(ml.local_end);
    } else if constexpr (kRowScales) {
      args.epilogue.thread = row_scaled<ElementD, typename K::TileShape>(a.row_scales, a.col_scales, a.bias);
    } else {
      if constexpr (K::kScaled) {
        args.epilogue.thread = tensor_wise_bias<ElementD, typename K::TileShape>(a.alpha, a.alpha_ptr, a.bias);
      } else {
        args.epilogue.thread.alpha = a.alpha;
        args.epilogue.thread.alpha_ptr = a.alpha_ptr;
        args.epilogue.thread.beta = 0.0f;
      }
    }
    args.epilogue.ptr_C = nullptr;
    args.epilogue.ptr_D = static_cast<ElementD*>(a.c);
    args.epilogue.dD = packed_stride<typename Kernel::StrideD>(rows, a.N);
    args.epilogue.row0 = static_cast<int32_t>(a.c_row0);
    args.epilogue.rows = static_cast<int32_t>(rows);
    if constexpr (K::kPingpongRs) args.epilogue.rs = a.rs;
  }

  args.hw_info = detail::hardware_info<Kernel>();
  if (a.sms > 0) {
    // The communicator's SM budget: the grid (one cluster per co-resident slot) and the last round's
    // split along K (async_input_scheduler.cuh) both follow these.
    args.hw_info.sm_count = std::min(args.hw_info.sm_count, a.sms);
    const int clusters = a.sms / static_cast<int>(cute::size(typename K::ClusterShape{}));
    args.hw_info.max_active_clusters = args.hw_info.max_active_clusters > 0
                                           ? std::min(args.hw_info.max_active_clusters, clusters)
                                           : clusters;
  }
  // Start at the first cluster row that begins inside the local rows (a row that straddles into the
  // previous rank's rows would wait for the last chunk to arrive).
  args.scheduler.first_m_cluster = static_cast<int>((a.local_begin + kRows - 1) / kRows);
  if (a.rs.rank >= 0) {
    // A reduce-scatter starts at rank+1's rows and ends with its own: every tile it stages comes before
    // every tile that waits for a peer, on every rank, which is what keeps the ranks from waiting on
    // each other in a circle (docs/design/fused_matmul_reduce_scatter.md).
    const int64_t next = (a.rs.rank + 1) % a.rs.world;
    args.scheduler.first_m_cluster = static_cast<int>(next * a.rs.rows_per_rank / kRows);
  }
  args.scheduler.band_m = a.band_m > 0 ? a.band_m : 1;
  args.scheduler.workspace = a.split_workspace;
  args.scheduler.workspace_sms = a.split_sms;
  // The ping-pong kernel moves each warpgroup's place in the pipeline by a whole tile's steps along K,
  // so its tiles are never split.
  args.scheduler.max_splits = kPingpong ? 1 : a.max_splits;
  args.scheduler.wait = a.split_wait;
  args.scheduler.rs = a.rs;
  args.scheduler.trace = a.trace;
  args.scheduler.done = a.done;
  return args;
}

template <class Element, class LayoutB, int kTileN, bool kReduceInEpilogue = false, int kClusterM = 2,
          bool kRowScales = false, bool kPingpong = false, class Out = ProductElement<Element>>
void launch_fused_gemm(const FusedGemmArgs& a, cudaStream_t stream) {
  using K = FusedGemmKernel<Element, LayoutB, kTileN, kReduceInEpilogue, kClusterM, kRowScales, kPingpong, Out>;
  using Gemm = typename K::Gemm;
  // Building the kernel's parameters encodes five TMA descriptors on the host; a call with the same
  // arguments as one of the last few reuses them, so a training loop pays that once. Only a set-up
  // that succeeded is kept.
  struct Cached {
    FusedGemmArgs args;
    Gemm gemm;
    int device = -1;
    CUfunction fn = nullptr;  // the kernel on that device
  };
  constexpr size_t kCached = 8;
  static std::mutex mu;
  static std::vector<std::unique_ptr<Cached>> cache;  // most recent last
  int device = 0;
  ASYNCTP_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mu);
  auto hit = std::find_if(cache.begin(), cache.end(),
                          [&](const auto& c) { return c->device == device && same_launch(c->args, a); });
  if (hit != cache.end()) {
    std::rotate(hit, hit + 1, cache.end());
  } else {
    const auto args =
        cutlass_arguments<Element, LayoutB, kTileN, kReduceInEpilogue, kClusterM, kRowScales, kPingpong, Out>(a);
    auto fresh = std::make_unique<Cached>();
    fresh->args = a;
    fresh->device = device;
    fresh->fn = detail::kernel_function<typename K::Kernel>();
    cutlass::Status status = fresh->gemm.can_implement(args);
    ASYNCTP_CHECK(status == cutlass::Status::kSuccess, "fused GEMM: CUTLASS cannot run M=", a.M,
                  " N=", a.N, " K=", a.K, ": ", cutlassGetStatusString(status));
    ASYNCTP_CHECK(Gemm::get_workspace_size(args) == 0, "fused GEMM: the kernel unexpectedly needs a workspace");
    status = fresh->gemm.initialize(args, nullptr, stream);
    ASYNCTP_CHECK(status == cutlass::Status::kSuccess, "fused GEMM: kernel set-up failed: ",
                  cutlassGetStatusString(status));
    if (cache.size() == kCached) cache.erase(cache.begin());
    cache.push_back(std::move(fresh));
  }
  const Cached& launch = *cache.back();
  detail::launch_on_clusters<typename K::ClusterShape, K::kEpilogueRs>(launch.gemm, launch.fn, a.rs.begin_epoch, stream);
}

}  // namespace asynctp::kernels::fused
