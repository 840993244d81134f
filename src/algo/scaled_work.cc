#include "algo/scaled_work.h"

namespace asynctp::algo {

ScaledWork ScaledWork::of(const Scaling& s, const float* a_scale) {
  ScaledWork w;
  if (!s.scaled) return w;
  w.on = 1;
  w.b_dtype = static_cast<int64_t>(s.b_dtype);
  w.out_dtype = static_cast<int64_t>(s.out_dtype);
  w.rowwise = s.rowwise ? 1 : 0;
  w.fast_accum = s.fast_accum ? 1 : 0;
  w.a_scale = a_scale;
  return w;
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
                     const float* a_scale, const void* b, const float* b_scale, void* d, cudaStream_t stream,
                     int lane) {
  runner.run_scaled(scaled(p, w), a, a_scale, b, b_scale, d, stream, lane);
}

}  // namespace asynctp::algo
