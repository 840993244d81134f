// asynctp-gemm-configs: plain bf16 GEMMs (A [M, K], B [K, N], D [M, N], all row-major) through CUTLASS 3
// Hopper kernels of a few schedules, tiles and clusters, and through the fused kernel itself, timed
// beside cuBLASLt on one GPU, each call behind a kernel that holds the GPU (the kernels' own time). It
// answers whether another configuration than the fused kernel's (cooperative, 128 x 256 tiles, 2 x 1
// cluster) would be faster at the partial GEMMs asynctp runs, and what the fused kernel's own chunks
// cost beside CUTLASS's kernel of the same configuration (docs/experiments.md). Diagnostic only: not built by default (`ninja -C build asynctp-gemm-configs`), no arguments.
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

#include "gemm/cublaslt_gemm.h"
#include "gpu_hold.cuh"
#include "kernels/fused/fused_gemm.h"
#include "kernels/fused/packed_stride.h"

using asynctp::kernels::fused::packed_stride;

using Elt = cutlass::bfloat16_t;
// Values in [-1, 1] (a GEMM's power draw, and so its clock, depends on its data).
__global__ void fill(Elt* p, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    unsigned x = unsigned(i) * 2654435761u + seed;
    x ^= x >> 13; x *= 0x5bd1e995u; x ^= x >> 15;
    p[i] = Elt(float(int(x % 2001) - 1000) / 1000.0f);
  }
}
template <class Tile, class Cluster, class KSched, class ESched>
struct Cfg {
  using Epi = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Tile, Cluster, cutlass::epilogue::collective::EpilogueTileAuto,
      float, float, void, cutlass::layout::RowMajor, 8, Elt, cutlass::layout::RowMajor, 8, ESched>::CollectiveOp;
  using Main = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Elt, cutlass::layout::RowMajor, 8, Elt, cutlass::layout::RowMajor, 8,
      float, Tile, Cluster, cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epi::SharedStorage))>,
      KSched>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, Main, Epi>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};

// Median of 50 timed calls of `launch` (after 10 untimed), each between two events and enqueued behind
// spin_for, so that it is timed without the host's launch work: what the kernels themselves take,
// which is what tells configurations apart.
template <class Launch>
float median_us(Launch&& launch, cudaStream_t s) {
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  std::vector<float> t;
  for (int i = 0; i < 60; ++i) {
    spin_for<<<1, 32, 0, s>>>(100000, nullptr);
    cudaEventRecord(e0, s); launch(); cudaEventRecord(e1, s); cudaEventSynchronize(e1);
    float ms; cudaEventElapsedTime(&ms, e0, e1); if (i >= 10) t.push_back(ms * 1000);
  }
  cudaEventDestroy(e0); cudaEventDestroy(e1);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// CUTLASS's kernel of configuration C, timed by median_us.
template <class C>
float run(const char* name, int M, int N, int K, Elt* a, Elt* b, Elt* d, cudaStream_t s) {
  using Gemm = typename C::Gemm;
  typename Gemm::Arguments args{cutlass::gemm::GemmUniversalMode::kGemm, {M, N, K, 1},
      {a, packed_stride<typename C::Kernel::StrideA>(M, K), b, packed_stride<typename C::Kernel::StrideB>(N, K)},
      {{1.0f, 0.0f}, nullptr, packed_stride<typename C::Kernel::StrideC>(M, N), d, packed_stride<typename C::Kernel::StrideD>(M, N)}};
  Gemm gemm;
  if (gemm.can_implement(args) != cutlass::Status::kSuccess) { printf("%s: cannot implement\n", name); return 0; }
  size_t ws = Gemm::get_workspace_size(args);
  void* w = nullptr;
  if (ws) cudaMalloc(&w, ws);
  gemm.initialize(args, w, s);
  const float median = median_us([&] { gemm.run(s); }, s);
  if (w) cudaFree(w);
  return median;
}

// The fused kernel itself as a plain GEMM (its scheduler, mainloop and epilogue on CUTLASS's
// cooperative 128 x 256 / 2 x 1 configuration), every tile whole, walking `band_m` cluster rows down
// before moving along N (0: its default); timed by median_us.
float fused(int M, int N, int K, int band_m, Elt* a, Elt* b, Elt* d, cudaStream_t s) {
  asynctp::kernels::fused::FusedGemmArgs g;
  g.M = M, g.N = N, g.K = K;
  g.a = a, g.b = b, g.c = d;
  g.tile_n = 256;
  g.band_m = band_m;
  return median_us([&] { asynctp::kernels::fused::run_fused_gemm(g, s); }, s);
}

// cuBLASLt as the library runs it (gemm::GemmRunner: the heuristic's first choice, its workspace), timed
// by median_us.
float cublas(int M, int N, int K, Elt* a, Elt* b, Elt* d, cudaStream_t s) {
  cublasLtHandle_t h;
  cublasLtCreate(&h);
  float median = 0;
  {
    asynctp::gemm::GemmRunner runner;
    runner.init(h);
    asynctp::gemm::Problem p;
    p.M = M, p.N = N, p.K = K;
    median = median_us([&] { runner.run(p, a, b, d, s); }, s);
  }  // the runner frees its plans and workspace before the handle goes
  cublasLtDestroy(h);
  return median;
}

using namespace cute;
using Coop = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
using Ping = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
using ECoop = cutlass::epilogue::TmaWarpSpecializedCooperative;
using EPing = cutlass::epilogue::TmaWarpSpecialized;
using C1 = Cfg<Shape<_128, _256, _64>, Shape<_2, _1, _1>, Coop, ECoop>;   // the fused kernel's configuration
using C2 = Cfg<Shape<_128, _256, _32>, Shape<_2, _1, _1>, Coop, ECoop>;   // the same, twice the stages of half the depth
using C3 = Cfg<Shape<_128, _256, _64>, Shape<_1, _1, _1>, Coop, ECoop>;   // the same without a cluster (no multicast)
using C4 = Cfg<Shape<_256, _128, _64>, Shape<_2, _1, _1>, Coop, ECoop>;
using C5 = Cfg<Shape<_128, _128, _64>, Shape<_1, _2, _1>, Ping, EPing>;

int main(int argc, char** argv) {
  if (argc > 1) {
    std::printf("usage: asynctp-gemm-configs\n\nTimes bf16 GEMMs at five partial-GEMM shapes through cuBLASLt, five "
                "CUTLASS Hopper\nconfigurations and the fused kernel as a plain GEMM (schedule, tile, cluster) on the current GPU; medians of 50 calls, each\nenqueued behind a kernel that holds the GPU (the kernels' own time, not the host's), µs.\n");
    return std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0 ? 0 : 2;
  }
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0) {
    std::fprintf(stderr, "asynctp-gemm-configs: no GPU visible\n");
    return 2;
  }
  const int shapes[][3] = {{4096, 3584, 4096}, {2048, 3584, 4096}, {12288, 7168, 2048}, {4096, 6656, 8192}, {16384, 8192, 4096}};
  asynctp::kernels::fused::load_fused_gemm_kernels();  // sets its shared-memory limit
  size_t mx = size_t(16384) * 8192;
  Elt *a, *b, *d;
  cudaMalloc(&a, mx * 2); cudaMalloc(&b, mx * 2); cudaMalloc(&d, mx * 2);
  fill<<<1024, 256>>>(a, mx, 1); fill<<<1024, 256>>>(b, mx, 2); cudaDeviceSynchronize();
  cudaStream_t s; cudaStreamCreate(&s);
  printf("M N K | cuBLASLt | coop128x256x64 c2x1 | coop128x256x32 c2x1 | coop128x256x64 c1x1 | coop256x128x64 c2x1 | "
         "ping128x128x64 c1x2 | fused kernel, band 8 | band 2 | band 1 (us)\n");
  for (auto& sh : shapes) {
    int M = sh[0], N = sh[1], K = sh[2];
    // One statement each, so that they run in the columns' order (a call's arguments may be evaluated
    // in any order, and a GEMM's clock depends on what ran before it).
    float t[9];
    t[0] = cublas(M, N, K, a, b, d, s);
    t[1] = run<C1>("c1", M, N, K, a, b, d, s);
    t[2] = run<C2>("c2", M, N, K, a, b, d, s);
    t[3] = run<C3>("c3", M, N, K, a, b, d, s);
    t[4] = run<C4>("c4", M, N, K, a, b, d, s);
    t[5] = run<C5>("c5", M, N, K, a, b, d, s);
    t[6] = fused(M, N, K, 8, a, b, d, s);
    t[7] = fused(M, N, K, 2, a, b, d, s);
    t[8] = fused(M, N, K, 1, a, b, d, s);
    printf("%d %d %d", M, N, K);
    for (float v : t) printf(" | %.1f", v);
    printf("\n");
  }
  return 0;
}
