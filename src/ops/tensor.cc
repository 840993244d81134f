#include "asynctp/tensor.h"

#include <cstdint>

#include "common/check.h"

namespace asynctp {

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kBF16: return "bf16";
    case DType::kFP16: return "fp16";
    case DType::kFP32: return "fp32";
    case DType::kFP8E4M3: return "fp8 e4m3";
    case DType::kFP8E5M2: return "fp8 e5m2";
  }
  return "unknown";
}

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kFP32: return 4;
    case DType::kFP8E4M3:
    case DType::kFP8E5M2: return 1;
    case DType::kBF16:
    case DType::kFP16: return 2;
  }
  return 2;
}

TensorRef TensorRef::dense(void* data, DType dtype, std::initializer_list<int64_t> shape) {
  ASYNCTP_CHECK(shape.size() >= 1 && shape.size() <= static_cast<size_t>(kMaxDims), "TensorRef::dense: ", shape.size(),
                " dims; 1 to ", kMaxDims, " are supported");
  TensorRef t;
  t.data = data;
  t.dtype = dtype;
  t.ndim = static_cast<int>(shape.size());
  int i = 0;
  for (int64_t d : shape) t.shape[i++] = d;
  int64_t stride = 1;
  for (int d = t.ndim - 1; d >= 0; --d) {
    t.strides[d] = stride;
    ASYNCTP_CHECK(!__builtin_mul_overflow(stride, t.shape[d], &stride), "TensorRef::dense: a shape of ", t.ndim,
                  " dims whose element count does not fit in int64");
  }
  return t;
}

// Shapes come from callers unchecked, so products saturate rather than overflow (the ops then refuse
// the tensor by name, ops/plan.cc).
int64_t TensorRef::numel() const {
  int64_t n = 1;
  for (int d = 0; d < ndim; ++d) {
    if (__builtin_mul_overflow(n, shape[d], &n)) return INT64_MAX;
  }
  return ndim > 0 ? n : 0;
}

bool TensorRef::is_dense() const {
  int64_t stride = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    if (shape[d] != 1 && strides[d] != stride) return false;
    if (__builtin_mul_overflow(stride, shape[d], &stride)) return d == 0;
  }
  return true;
}

}  // namespace asynctp
