#include "reference/reference.h"

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cmath>

#include "common/check.h"
#include "gemm/cublaslt_gemm.h"
#include "kernels/convert.cuh"

namespace asynctp::reference {
namespace {

__host__ __device__ inline uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}

__device__ inline float value(const GenMatrix& g, int64_t i, int64_t j) {
  const int64_t block = (g.row_block ? i / g.row_block : 0) + (g.col_block ? j / g.col_block : 0);
  const int64_t ii = g.row_block ? i % g.row_block : i;
  const int64_t jj = g.col_block ? j % g.col_block : j;
  const uint64_t h = mix(mix(g.seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(block)) ^
                         (static_cast<uint64_t>(ii) << 32 | static_cast<uint64_t>(jj)));
  return static_cast<float>(static_cast<int>(h >> 58) - 32) / 32.0f;
}

// fp8 rounds to nearest and saturates (the values are within range); the other types as the kernels do.
template <typename T>
__device__ inline T stored(float v) {
  return kernels::from_float<T>(v);
}
template <>
__device__ inline __nv_fp8_e4m3 stored<__nv_fp8_e4m3>(float v) {
  return __nv_fp8_e4m3(v);
}
template <>
__device__ inline __nv_fp8_e5m2 stored<__nv_fp8_e5m2>(float v) {
  return __nv_fp8_e5m2(v);
}

// `Rounded` is the type each value is rounded through before it is stored as T: fp32 windows of an fp8
// matrix hold exactly what the fp8 one does.
template <typename T, typename Rounded = T>
__global__ void fill_kernel(T* out, int64_t rows, int64_t cols, bool col_major, GenMatrix g, int64_t row0, int64_t col0) {
  const int64_t n = rows * cols;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    // idx walks the storage order, so writes are coalesced either way.
    const int64_t i = col_major ? idx % rows : idx / cols;
    const int64_t j = col_major ? idx / rows : idx % cols;
    out[idx] = stored<T>(static_cast<float>(stored<Rounded>(value(g, row0 + i, col0 + j))));
  }
}

__global__ void scale_kernel(float* m, int64_t rows, int64_t cols, const float* row_scale, bool row_vector,
                             const float* col_scale, bool col_vector) {
  const int64_t n = rows * cols;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = idx / cols, j = idx % cols;
    const float r = row_scale ? row_scale[row_vector ? i : 0] : 1.0f;
    const float c = col_scale ? col_scale[col_vector ? j : 0] : 1.0f;
    m[idx] *= r * c;
  }
}

struct CompareState {
  float max_err;
  float max_ref;
  unsigned long long bad;
  unsigned long long first_key;  // n - (index of the first bad element), 0 if none
  unsigned long long last_key;   // 1 + (index of the last bad element), 0 if none
};

// Pass 1 finds max|ref|, pass 2 the error and bad count (the tolerance depends on max|ref|).
template <typename T>
__global__ void compare_kernel(const T* out, int64_t rows, int64_t cols, const float* ref, int64_t ld, int64_t row0,
                               int64_t col0, float scale, double tol, CompareState* st, int pass) {
  const int64_t n = rows * cols;
  float local_err = 0, local_ref = 0;
  unsigned long long local_bad = 0, first_key = 0, last_key = 0;
  const float limit = pass == 2 ? static_cast<float>(tol * fmax(1.0, static_cast<double>(st->max_ref))) : 0.f;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = idx / cols, j = idx % cols;
    const float r = scale * ref[(row0 + i) * ld + col0 + j];
    if (pass == 1) {
      local_ref = fmaxf(local_ref, fabsf(r));
    } else {
      const float o = kernels::to_float(out[idx]);
      const float e = fabsf(o - r);
      if (!isfinite(o) || !(e <= limit)) {
        ++local_bad;
        first_key = max(first_key, static_cast<unsigned long long>(n - idx));
        last_key = max(last_key, static_cast<unsigned long long>(idx + 1));
      }
      if (isfinite(o)) local_err = fmaxf(local_err, e);
    }
  }
  // Non-negative floats order like their bit patterns.
  if (pass == 1) atomicMax(reinterpret_cast<unsigned int*>(&st->max_ref), __float_as_uint(local_ref));
  if (pass == 2) {
    atomicMax(reinterpret_cast<unsigned int*>(&st->max_err), __float_as_uint(local_err));
    if (local_bad) {
      atomicAdd(&st->bad, local_bad);
      atomicMax(&st->first_key, first_key);
      atomicMax(&st->last_key, last_key);
    }
  }
}

constexpr int kBlocks = 1024, kThreads = 256;

}  // namespace

void fill(void* data, DType dtype, int64_t rows, int64_t cols, bool col_major, const GenMatrix& g, int64_t row0,
          int64_t col0, cudaStream_t stream) {
  switch (dtype) {
    case DType::kBF16:
      fill_kernel<<<kBlocks, kThreads, 0, stream>>>(static_cast<__nv_bfloat16*>(data), rows, cols, col_major, g, row0, col0);
      break;
    case DType::kFP16:
      fill_kernel<<<kBlocks, kThreads, 0, stream>>>(static_cast<__half*>(data), rows, cols, col_major, g, row0, col0);
      break;
    case DType::kFP32:
      fill_kernel<<<kBlocks, kThreads, 0, stream>>>(static_cast<float*>(data), rows, cols, col_major, g, row0, col0);
      break;
    case DType::kFP8E4M3:
      fill_kernel<<<kBlocks, kThreads, 0, stream>>>(static_cast<__nv_fp8_e4m3*>(data), rows, cols, col_major, g, row0,
                                                    col0);
      break;
    case DType::kFP8E5M2:
      fill_kernel<<<kBlocks, kThreads, 0, stream>>>(static_cast<__nv_fp8_e5m2*>(data), rows, cols, col_major, g, row0,
                                                    col0);
      break;
  }
  ASYNCTP_CUDA_CHECK(cudaGetLastError());
}

void fill_fp32(float* data, int64_t rows, int64_t cols, const GenMatrix& g, int64_t row0, int64_t col0,
               cudaStream_t stream) {
  fill(data, DType::kFP32, rows, cols, false, g, row0, col0, stream);
}

void fill_fp32_as(float* data, DType as, int64_t rows, int64_t cols, const GenMatrix& g, int64_t row0, int64_t col0,
                  cudaStream_t stream) {
  switch (as) {
    case DType::kFP8E4M3:
      fill_kernel<float, __nv_fp8_e4m3><<<kBlocks, kThreads, 0, stream>>>(data, rows, cols, false, g, row0, col0);
      break;
    case DType::kFP8E5M2:
      fill_kernel<float, __nv_fp8_e5m2><<<kBlocks, kThreads, 0, stream>>>(data, rows, cols, false, g, row0, col0);
      break;
    case DType::kBF16:
    case DType::kFP16:
    case DType::kFP32:
      fill_kernel<<<kBlocks, kThreads, 0, stream>>>(data, rows, cols, false, g, row0, col0);  // exact in these
      break;
  }
  ASYNCTP_CUDA_CHECK(cudaGetLastError());
}

void scale(float* data, int64_t rows, int64_t cols, const float* row_scale, int64_t row_count, const float* col_scale,
           int64_t col_count, cudaStream_t stream) {
  scale_kernel<<<kBlocks, kThreads, 0, stream>>>(data, rows, cols, row_scale, row_count > 1, col_scale, col_count > 1);
  ASYNCTP_CUDA_CHECK(cudaGetLastError());
}

__global__ void add_row_kernel(float* m, int64_t rows, int64_t cols, const float* row, float times) {
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < rows * cols;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    m[idx] += times * row[idx % cols];
  }
}

void add_row(float* data, int64_t rows, int64_t cols, const float* row, float times, cudaStream_t stream) {
  add_row_kernel<<<kBlocks, kThreads, 0, stream>>>(data, rows, cols, row, times);
  ASYNCTP_CUDA_CHECK(cudaGetLastError());
}

void poison(void* data, size_t bytes, cudaStream_t stream) {
  ASYNCTP_CUDA_CHECK(cudaMemsetAsync(data, 0xFF, bytes, stream));
}

Comparison compare(const void* out, DType dtype, int64_t rows, int64_t cols, const float* ref, int64_t ld_ref,
                   int64_t row0, int64_t col0, float scale, double tol, cudaStream_t stream) {
  CompareState* st = nullptr;
  ASYNCTP_CUDA_CHECK(cudaMallocAsync(&st, sizeof *st, stream));
  ASYNCTP_CUDA_CHECK(cudaMemsetAsync(st, 0, sizeof *st, stream));
  for (int pass = 1; pass <= 2; ++pass) {
    if (dtype == DType::kBF16) {
      compare_kernel<<<kBlocks, kThreads, 0, stream>>>(static_cast<const __nv_bfloat16*>(out), rows, cols, ref, ld_ref,
                                                       row0, col0, scale, tol, st, pass);
    } else if (dtype == DType::kFP8E4M3) {
      compare_kernel<<<kBlocks, kThreads, 0, stream>>>(static_cast<const __nv_fp8_e4m3*>(out), rows, cols, ref, ld_ref,
                                                       row0, col0, scale, tol, st, pass);
    } else {
      compare_kernel<<<kBlocks, kThreads, 0, stream>>>(static_cast<const __half*>(out), rows, cols, ref, ld_ref, row0,
                                                       col0, scale, tol, st, pass);
    }
    ASYNCTP_CUDA_CHECK(cudaGetLastError());
  }
  // The copy into pageable memory is made once the stream is idle: where ranks are threads of one
  // process, it could otherwise wait behind a peer's (docs/design/transport.md).
  ASYNCTP_CUDA_CHECK(cudaStreamSynchronize(stream));
  CompareState h{};
  ASYNCTP_CUDA_CHECK(cudaMemcpyAsync(&h, st, sizeof h, cudaMemcpyDeviceToHost, stream));
  ASYNCTP_CUDA_CHECK(cudaFreeAsync(st, stream));
  ASYNCTP_CUDA_CHECK(cudaStreamSynchronize(stream));
  Comparison c{h.max_err, h.max_ref, static_cast<int64_t>(h.bad)};
  if (h.bad) {
    const int64_t first = rows * cols - static_cast<int64_t>(h.first_key), last = static_cast<int64_t>(h.last_key) - 1;
    c.first_bad_row = first / cols;
    c.first_bad_col = first % cols;
    c.last_bad_row = last / cols;
  }
  return c;
}

std::string Comparison::where() const {
  if (bad == 0) return {};
  return detail::cat(" (first bad element at row ", first_bad_row, " col ", first_bad_col, ", last in row ",
                     last_bad_row, ")");
}

double tolerance(DType dtype, int terms) {
  // One rounding of the result to the output type (2^-8 relative for bf16, 2^-11 for fp16, 2^-4 for fp8
  // e4m3), per term of a reduction done in that type, with a factor of 2 to spare. An fp8 output is
  // rounded once, after a reduction in bf16.
  if (dtype == DType::kFP8E4M3) return 2.0 / 16 + tolerance(DType::kBF16, terms);
  const double unit = dtype == DType::kBF16 ? 1.0 / 256 : 1.0 / 2048;
  return 2.0 * unit * (terms < 1 ? 1 : terms);
}

double fast_accum_tolerance(DType dtype, int terms, int64_t k) {
  const double accumulation = std::sqrt(static_cast<double>(k < 1 ? 1 : k) / 1024.0) / 128.0;
  return tolerance(dtype, terms) + accumulation * (terms < 1 ? 1 : terms);
}

struct Fp32Gemm::State {
  cublasLtHandle_t handle = nullptr;
  gemm::GemmRunner runner;
};

Fp32Gemm::Fp32Gemm() : state_(new State) {
  ASYNCTP_CUBLAS_CHECK(cublasLtCreate(&state_->handle));
  state_->runner.init(state_->handle);
}

Fp32Gemm::~Fp32Gemm() {
  state_->runner.reset();
  cublasLtDestroy(state_->handle);
  delete state_;
}

void Fp32Gemm::run(const float* a, const float* b, float* c, int64_t M, int64_t N, int64_t K, cudaStream_t stream) {
  gemm::Problem p;
  p.M = M;
  p.N = N;
  p.K = K;
  p.dtype = DType::kFP32;
  state_->runner.run(p, a, b, c, stream);
}

}  // namespace asynctp::reference
