// Internal: *out = *a * *b on the GPU, in stream order: the fused kernel's fp8 alpha from tensor-wise
// scales that live in device memory (and may change between replays of a captured call).
#pragma once

#include <cuda_runtime_api.h>

namespace asynctp::kernels {

void scale_product(const float* a, const float* b, float* out, cudaStream_t stream);

}  // namespace asynctp::kernels
