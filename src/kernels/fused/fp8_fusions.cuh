// The fp8 instantiations' epilogue fusions: CUTLASS 3 epilogue visitor trees over a tile's accumulators,
// with the scaled op's bias (of the product's type, FusedGemmArgs::bias) broadcast along M and staged
// once per tile in shared memory; a null bias adds nothing and loads nothing.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/epilogue/fusion/operations.hpp>
#include <cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp>

#include <cstdint>

namespace asynctp::kernels::fused {

namespace evt = cutlass::epilogue::fusion;

// D = alpha * acc + bias[n], alpha a value or a device pointer (the product of the tensor-wise scales;
// 1 where the consumers have scaled the accumulators themselves). Our own tree, not CUTLASS's
// LinCombPerColBias: that one also computes beta * C without a source, one FFMA a value more.
template <class ElementD, class TileShape>
using TensorWiseBias =
    evt::Sm90EVT<evt::Sm90Compute<cutlass::homogeneous_multiply_add, ElementD, float, cutlass::FloatRoundStyle::round_to_nearest>,
                 evt::Sm90ScalarBroadcast<float, cute::Stride<cute::_0, cute::_0, int64_t>>, evt::Sm90AccFetch,
                 evt::Sm90RowBroadcast<0, TileShape, ElementD, float, cute::Stride<cute::_0, cute::_1, int64_t>,
                                       16 / sizeof(ElementD)>>;

// TensorWiseBias's arguments: {alpha (a pointer overrides the value), acc, bias (null: none), multiply-add}.
template <class ElementD, class TileShape>
typename TensorWiseBias<ElementD, TileShape>::Arguments tensor_wise_bias(float alpha, const float* alpha_ptr,
                                                                         const void* bias) {
  return {{{alpha}, {alpha_ptr}, {}}, {}, {static_cast<const ElementD*>(bias), ElementD(0.0f), {}}, {}};
}

// Row-wise scales in the ping-pong schedule, whose other warpgroup's mainloop hides its epilogue's loads:
// D = col_scales[n] * (row_scales[m] * acc) + bias[n], the row's scale broadcast along N (read into
// registers), the column's scale and the bias along M (staged in shared memory).
template <class ElementD, class TileShape>
using RowScaled = evt::Sm90EVT<
    evt::Sm90Compute<cutlass::homogeneous_multiply_add, ElementD, float, cutlass::FloatRoundStyle::round_to_nearest>,
    evt::Sm90RowBroadcast<0, TileShape, float, float, cute::Stride<cute::_0, cute::_1, cute::_0>, 4, /*EnableNullptr=*/false>,
    evt::Sm90EVT<evt::Sm90Compute<cutlass::multiplies, float, float, cutlass::FloatRoundStyle::round_to_nearest>,
                 evt::Sm90ColBroadcast<0, TileShape, float, float, cute::Stride<cute::_1, cute::_0, cute::_0>, 4,
                                       /*EnableNullptr=*/false>,
                 evt::Sm90AccFetch>,
    evt::Sm90RowBroadcast<0, TileShape, ElementD, float, cute::Stride<cute::_0, cute::_1, cute::_0>, 16 / sizeof(ElementD)>>;

// RowScaled's arguments: {column scales, {row scales, acc, multiply}, bias (null: none), multiply-add}.
template <class ElementD, class TileShape>
typename RowScaled<ElementD, TileShape>::Arguments row_scaled(const float* row_scales, const float* col_scales,
                                                              const void* bias) {
  return {{col_scales, 0.0f, {}}, {{row_scales, 0.0f, {}}, {}, {}}, {static_cast<const ElementD*>(bias), ElementD(0.0f), {}}, {}};
}

}  // namespace asynctp::kernels::fused
