// Internal: the few CUDA driver functions asynctp uses, looked up through the runtime
// (cudaGetDriverEntryPointByVersion) so that nothing links libcuda and the CPU-only parts load on
// machines without a GPU driver.
#pragma once

#include <cuda.h>

namespace asynctp::detail {

struct DriverApi {
  CUresult (*stream_write_value32)(CUstream, CUdeviceptr, cuuint32_t, unsigned int) = nullptr;
  CUresult (*stream_wait_value32)(CUstream, CUdeviceptr, cuuint32_t, unsigned int) = nullptr;
  CUresult (*stream_batch_mem_op)(CUstream, unsigned int, CUstreamBatchMemOpParams*, unsigned int) = nullptr;
  // The fused GEMM's launch: for that kernel the runtime's cudaLaunchKernelExC took ~2.3 us more host
  // time than this (docs/design/fused_all_gather_matmul.md, "Host cost").
  CUresult (*launch_kernel_ex)(const CUlaunchConfig*, CUfunction, void**, void**) = nullptr;
};

// Looked up once per process; throws asynctp::Error if the driver lacks one of them.
const DriverApi& driver();

// Whether CUDA loads this process's kernels lazily, at their first launch (cuModuleGetLoadingMode:
// CUDA_MODULE_LOADING=LAZY, CUDA's default, read at the process's first CUDA call).
bool lazy_module_loading();

// cuGetErrorString where the driver is reachable, else "unknown".
const char* driver_error_string(int code);

}  // namespace asynctp::detail
