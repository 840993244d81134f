// Internal: out = scale * (parts[0] + parts[1] + ... ), element-wise, accumulated in fp32 and rounded
// once. The order of the terms is the order of `parts`, so the same inputs give the same bits on every
// run. The reduce-scatter algorithms use it to combine the partial products that landed on a rank.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "common/element.h"

namespace asynctp::kernels {

constexpr int kMaxPartials = 72;  // an NVL72 rack is the largest LSA team there is

// Every pointer 16-byte aligned; `count` elements of `element` (bf16 or fp16) each.
void sum_partials(Element element, const std::vector<const void*>& parts, void* out, int64_t count, float scale,
                  cudaStream_t stream);

// As sum_partials, into `out` of `out_element` (bf16, fp16, or fp8 e4m3, saturating), the sum also
// multiplied by *out_scale (one fp32 on the GPU) where that is not null: a scaled op's fp8 output.
void sum_partials_to(Element element, const std::vector<const void*>& parts, Element out_element, void* out,
                     int64_t count, float scale, const float* out_scale, cudaStream_t stream);

}  // namespace asynctp::kernels
