// TensorRef: a non-owning view of a tensor in GPU memory (pointer, dtype, shape, strides), shaped like
// DLPack so that framework tensors map onto it without copies. Strides are in elements.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>

namespace asynctp {

// kFP8E4M3 and kFP8E5M2 (OCP fp8, as torch.float8_e4m3fn and torch.float8_e5m2) are the scaled ops'
// inputs (scaled_ops.h); the other ops take bf16 and fp16.
enum class DType { kBF16, kFP16, kFP32, kFP8E4M3, kFP8E5M2 };

const char* dtype_name(DType dtype);
size_t dtype_size(DType dtype);

// How B is stored. kRowMajor: [K, N], N contiguous. kColMajor: [N, K], K contiguous, the way
// torch.nn.Linear stores its weight (so C = A @ W.T).
enum class BLayout { kRowMajor, kColMajor };

struct TensorRef {
  static constexpr int kMaxDims = 6;

  void* data = nullptr;
  DType dtype = DType::kBF16;
  int ndim = 0;
  int64_t shape[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};

  // A dense row-major view (the last dim contiguous). Throws asynctp::Error if the element count
  // overflows int64.
  static TensorRef dense(void* data, DType dtype, std::initializer_list<int64_t> shape);

  int64_t numel() const;  // saturates at INT64_MAX for shapes whose product overflows
  size_t bytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  bool is_dense() const;  // row-major contiguous, as dense() makes
  bool defined() const { return data != nullptr || ndim > 0; }
};

}  // namespace asynctp
