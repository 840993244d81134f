#include "kernels/sum_partials.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>

#include "common/check.h"
#include "kernels/convert.cuh"

namespace asynctp::kernels {
namespace {

struct Parts {
  const void* p[kMaxPartials];
  int n;
};

constexpr int kVec = 8;  // 16-bit elements a 16-byte load

// kVec output elements, stored at once.
template <typename TOut>
struct alignas(sizeof(TOut) * kVec) Packed {
  TOut v[kVec];
};

// Each thread sums 8 elements (one 16-byte load per part) per step; a tail of fewer than 8 is summed
// element by element by the first threads.
template <typename T, typename TOut>
__global__ void sum_partials_kernel(Parts parts, TOut* out, int64_t count, float scale, const float* out_scale) {
  if (out_scale != nullptr) scale *= *out_scale;
  const int64_t vectors = count / kVec;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t v = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; v < vectors; v += stride) {
    float acc[kVec] = {};
    for (int i = 0; i < parts.n; ++i) {
      const uint4 raw = __ldg(static_cast<const uint4*>(parts.p[i]) + v);
      const T* x = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int k = 0; k < kVec; ++k) acc[k] += to_float(x[k]);
    }
    Packed<TOut> packed;
#pragma unroll
    for (int k = 0; k < kVec; ++k) packed.v[k] = from_float<TOut>(acc[k] * scale);
    reinterpret_cast<Packed<TOut>*>(out)[v] = packed;
  }
  const int64_t tail = vectors * kVec + static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (tail < count && tail < vectors * kVec + kVec) {
    float acc = 0.0f;
    for (int i = 0; i < parts.n; ++i) acc += to_float(static_cast<const T*>(parts.p[i])[tail]);
    out[tail] = from_float<TOut>(acc * scale);
  }
}

template <typename T>
void launch(const Parts& p, Element out_element, void* out, int64_t count, float scale, const float* out_scale,
            cudaStream_t stream) {
  constexpr int kThreads = 256;
  const int64_t vectors = count / kVec;
  // Enough blocks to fill the GPU a few times over; the loop covers the rest.
  const int blocks = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>((vectors + kThreads - 1) / kThreads, 132 * 8)));
  switch (out_element) {
    case Element::kBF16:
      sum_partials_kernel<T><<<blocks, kThreads, 0, stream>>>(p, static_cast<__nv_bfloat16*>(out), count, scale, out_scale);
      break;
    case Element::kFP16:
      sum_partials_kernel<T><<<blocks, kThreads, 0, stream>>>(p, static_cast<__half*>(out), count, scale, out_scale);
      break;
    case Element::kFP8E4M3:
      sum_partials_kernel<T><<<blocks, kThreads, 0, stream>>>(p, static_cast<__nv_fp8_e4m3*>(out), count, scale, out_scale);
      break;
  }
  ASYNCTP_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void sum_partials_to(Element element, const std::vector<const void*>& parts, Element out_element, void* out,
                     int64_t count, float scale, const float* out_scale, cudaStream_t stream) {
  ASYNCTP_CHECK(!parts.empty() && parts.size() <= static_cast<size_t>(kMaxPartials), "sum_partials: ", parts.size(),
                " parts; expected 1 to ", kMaxPartials);
  ASYNCTP_CHECK(element == Element::kBF16 || element == Element::kFP16, "sum_partials: element ", element_name(element),
                " is not supported; expected bf16 or fp16");
  Parts p{};
  p.n = static_cast<int>(parts.size());
  for (size_t i = 0; i < parts.size(); ++i) {
    ASYNCTP_CHECK(reinterpret_cast<uintptr_t>(parts[i]) % 16 == 0, "sum_partials: part ", i, " is not 16-byte aligned");
    p.p[i] = parts[i];
  }
  ASYNCTP_CHECK(reinterpret_cast<uintptr_t>(out) % 16 == 0, "sum_partials: out is not 16-byte aligned");
  if (element == Element::kBF16) {
    launch<__nv_bfloat16>(p, out_element, out, count, scale, out_scale, stream);
  } else {
    launch<__half>(p, out_element, out, count, scale, out_scale, stream);
  }
}

void sum_partials(Element element, const std::vector<const void*>& parts, void* out, int64_t count, float scale,
                  cudaStream_t stream) {
  sum_partials_to(element, parts, element, out, count, scale, nullptr, stream);
}

}  // namespace asynctp::kernels
