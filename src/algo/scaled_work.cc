#include "algo/scaled_work.h"

#include <cstdint>

#include "algo/bytes.h"
#include "common/check.h"

namespace asynctp::algo {

ScaledWork ScaledWork::of(const Scaling& s, const float* a_scale, DType out_dtype) {
  ScaledWork w;
  if (!s.scaled) return w;
  w.on = 1;
  w.b_dtype = static_cast<int64_t>(s.b_dtype);
  w.out_dtype = static_cast<int64_t>(out_dtype);
  w.rowwise = s.rowwise ? 1 : 0;
  w.fast_accum = s.fast_accum ? 1 : 0;
  w.a_scale = a_scale;
  return w;
}

size_t ScaledWork::slot_bytes(const Scaling& s, int64_t max_scales, int lanes) {
  return s.scaled && s.rowwise ? static_cast<size_t>(lanes) * 2 * align_up(static_cast<size_t>(max_scales) * sizeof(float))
                               : 0;
}

void ScaledWork::use_slots(void* at, int64_t max_scales) {
  slots = static_cast<float*>(at);
  slot_floats = static_cast<int64_t>(align_up(static_cast<size_t>(max_scales) * sizeof(float)) / sizeof(float));
}

gemm::Problem scaled(gemm::Problem p, const ScaledWork& w) {
  p.b_layout = BLayout::kColMajor;  // fp8 GEMMs take B column-major only (the plan checks it)
  p.scaled = true;
  p.b_dtype = static_cast<DType>(w.b_dtype);
  p.out_dtype = static_cast<DType>(w.out_dtype);
  p.rowwise = w.rowwise != 0;
  p.fast_accum = w.fast_accum != 0;
  return p;
}

void run_scaled_gemm(gemm::GemmRunner& runner, const ScaledWork& w, const gemm::Problem& p, const void* a,
                     const void* b, gemm::ScaledPointers ptrs, void* d, cudaStream_t stream, int lane) {
  auto aligned = [&](const float* scales, int64_t n, int which) {
    if (!w.rowwise || reinterpret_cast<uintptr_t>(scales) % 16 == 0) return scales;
    ASYNCTP_CHECK(w.slots != nullptr && n <= w.slot_floats, "run_scaled_gemm: ", n,
                  " unaligned scales and no slot for them");
    float* slot = w.slots + (2 * static_cast<int64_t>(lane) + which) * w.slot_floats;
    ASYNCTP_CUDA_CHECK(cudaMemcpyAsync(slot, scales, static_cast<size_t>(n) * sizeof(float), cudaMemcpyDeviceToDevice,
                                       stream));
    return static_cast<const float*>(slot);
  };
  ptrs.a_scale = aligned(ptrs.a_scale, p.M, 0);
  ptrs.b_scale = aligned(ptrs.b_scale, p.N, 1);
  runner.run_scaled(scaled(p, w), a, b, ptrs, d, stream, lane);
}

}  // namespace asynctp::algo
