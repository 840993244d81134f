// Device memory owned for one scope, for the tools' inputs, outputs and references.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "common/check.h"

namespace asynctp::bench {

struct DeviceBuffer {
  void* p = nullptr;
  explicit DeviceBuffer(size_t bytes) { ASYNCTP_CUDA_CHECK(cudaMalloc(&p, bytes)); }
  ~DeviceBuffer() { cudaFree(p); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  float* f() const { return static_cast<float*>(p); }
  template <class T>
  T* as() const { return static_cast<T*>(p); }
};

}  // namespace asynctp::bench
