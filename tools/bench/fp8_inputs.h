// asynctp-bench's and asynctp-tune's fp8 inputs beside A and B, the same on every rank: the scales and
// the bias, exact in their types, with what the fp32 reference needs of them.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "bench/case.h"
#include "bench/device_buffer.h"
#include "common/check.h"

namespace asynctp::bench {

// fp8's scales, exact in fp32 and the same on every rank: 0.5 to 1.25 by row of the whole A and by
// column of B (row-wise), or 0.75 and 1.25 (tensor-wise). Made for every dtype; only fp8 reads them.
struct Fp8Scales {
  int64_t a_count, b_count;
  int64_t b_offset;  // B's start in floats, 256-byte aligned as cuBLASLt wants scale vectors
  int64_t product_offset;  // tensor-wise: a_scale * b_scale, the fused kernel's alpha
  DeviceBuffer buf;
  Fp8Scales(const CaseSetup& s, int64_t M, int64_t N, cudaStream_t stream)
      : a_count(s.rowwise_scales ? M : 1), b_count(s.rowwise_scales ? N : 1), b_offset((a_count + 63) / 64 * 64),
        product_offset(b_offset + b_count), buf(static_cast<size_t>(product_offset + 1) * sizeof(float), stream) {
    std::vector<float> host(static_cast<size_t>(product_offset + 1), 0.0f);
    for (int64_t i = 0; i < a_count; ++i) host[i] = s.rowwise_scales ? 0.5f + static_cast<float>(i % 7) * 0.125f : 0.75f;
    for (int64_t j = 0; j < b_count; ++j) {
      host[b_offset + j] = s.rowwise_scales ? 0.5f + static_cast<float>((j + 3) % 7) * 0.125f : 1.25f;
    }
    host[product_offset] = host[0] * host[b_offset];
    ASYNCTP_CUDA_CHECK(cudaMemcpyAsync(buf.p, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice, stream));
    ASYNCTP_CUDA_CHECK(cudaStreamSynchronize(stream));  // `host` goes out of scope
  }
  float* a() const { return buf.f(); }
  float* b() const { return buf.f() + b_offset; }
  float* product() const { return buf.f() + product_offset; }
};

// The bits of `v` in bf16 and fp16, for values those hold exactly (zero, or normal with few
// significant bits), as the bias's are.
inline uint16_t bf16_bits(float v) {
  uint32_t w;
  std::memcpy(&w, &v, sizeof w);
  return static_cast<uint16_t>(w >> 16);
}
inline uint16_t fp16_bits(float v) {
  uint32_t w;
  std::memcpy(&w, &v, sizeof w);
  const uint32_t sign = (w >> 16) & 0x8000u;
  if ((w & 0x7FFFFFFFu) == 0) return static_cast<uint16_t>(sign);
  const uint32_t exponent = ((w >> 23) & 0xFFu) - 127u + 15u;
  return static_cast<uint16_t>(sign | (exponent << 10) | ((w >> 13) & 0x3FFu));
}

// fp8's bias over N, the same on every rank: values exact in bf16 and fp16 (-3 to 3 in halves), in the
// output's dtype (`values`), and the same as fp32 for the reference.
struct Fp8Bias {
  DeviceBuffer values, fp32;
  Fp8Bias(int64_t N, DType dtype, cudaStream_t stream) : values(N * 2, stream), fp32(N * sizeof(float), stream) {
    std::vector<float> exact(static_cast<size_t>(N));
    std::vector<uint16_t> bits(static_cast<size_t>(N));
    for (int64_t j = 0; j < N; ++j) {
      exact[j] = static_cast<float>(j % 13 - 6) * 0.5f;
      bits[j] = dtype == DType::kFP16 ? fp16_bits(exact[j]) : bf16_bits(exact[j]);
    }
    ASYNCTP_CUDA_CHECK(cudaMemcpyAsync(values.p, bits.data(), bits.size() * 2, cudaMemcpyHostToDevice, stream));
    ASYNCTP_CUDA_CHECK(cudaMemcpyAsync(fp32.p, exact.data(), exact.size() * sizeof(float), cudaMemcpyHostToDevice, stream));
    ASYNCTP_CUDA_CHECK(cudaStreamSynchronize(stream));  // the host vectors go out of scope
  }
};

}  // namespace asynctp::bench
