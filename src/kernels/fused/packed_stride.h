// Internal: CUTLASS 3 strides for packed operands, shared by the fused kernel's host set-up
// (fused_gemm_kernel.cuh) and asynctp-gemm-configs.
#pragma once

#include <cute/tensor.hpp>

#include <cstdint>

namespace asynctp::kernels::fused {

// A packed stride of CUTLASS's (MN, K, L) form for a matrix of `mn` x `k`: whichever of the first two
// modes is the static 1 is the contiguous one.
template <class Stride>
Stride packed_stride(int64_t mn, int64_t k) {
  Stride s{};
  if constexpr (cute::is_static_v<cute::remove_cvref_t<decltype(cute::get<0>(s))>>) {
    cute::get<1>(s) = mn;
  } else {
    cute::get<0>(s) = k;
  }
  cute::get<2>(s) = mn * k;
  return s;
}

}  // namespace asynctp::kernels::fused
