// Device memory owned for one scope, for the tools' inputs, outputs and references, allocated and
// freed in the order of the stream that uses it. Where ranks are threads sharing a GPU, cudaFree
// would wait for the whole device, and so for a peer's kernel that waits for this rank's next call.
// Words that stream memory operations (cuStreamWriteValue32, cuStreamWaitValue32) touch take plain
// device memory instead (no stream): the driver refuses those operations on stream-ordered pool memory.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "common/check.h"

namespace asynctp::bench {

struct DeviceBuffer {
  void* p = nullptr;
  cudaStream_t stream = nullptr;
  bool pooled = true;
  DeviceBuffer(size_t bytes, cudaStream_t s) : stream(s) { ASYNCTP_CUDA_CHECK(cudaMallocAsync(&p, bytes, stream)); }
  explicit DeviceBuffer(size_t bytes) : pooled(false) { ASYNCTP_CUDA_CHECK(cudaMalloc(&p, bytes)); }
  ~DeviceBuffer() { pooled ? cudaFreeAsync(p, stream) : cudaFree(p); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  float* f() const { return static_cast<float*>(p); }
  template <class T>
  T* as() const { return static_cast<T*>(p); }
};

}  // namespace asynctp::bench
