#include "common/driver_api.h"

#include <cuda_runtime_api.h>

#include <mutex>

#include "common/check.h"

namespace asynctp::detail {
namespace {

// 12.0 is the ABI of the stream memory operations as they are now (their _v2 forms).
constexpr unsigned int kDriverAbi = 12000;

template <typename Fn>
void lookup(const char* symbol, Fn*& out) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult status{};
  ASYNCTP_CUDA_CHECK(cudaGetDriverEntryPointByVersion(symbol, &fn, kDriverAbi, cudaEnableDefault, &status));
  ASYNCTP_CHECK(status == cudaDriverEntryPointSuccess && fn != nullptr, "the CUDA driver has no ", symbol,
                " (ABI ", kDriverAbi, "); update the NVIDIA driver to one that supports CUDA 13");
  out = reinterpret_cast<Fn*>(fn);
}

}  // namespace

const DriverApi& driver() {
  static DriverApi api;
  static std::once_flag once;
  std::call_once(once, [] {
    lookup("cuStreamWriteValue32", api.stream_write_value32);
    lookup("cuStreamWaitValue32", api.stream_wait_value32);
    lookup("cuStreamBatchMemOp", api.stream_batch_mem_op);
    lookup("cuLaunchKernelEx", api.launch_kernel_ex);
  });
  return api;
}

bool lazy_module_loading() {
  using GetLoadingMode = CUresult (*)(CUmoduleLoadingMode*);
  GetLoadingMode fn = nullptr;
  lookup("cuModuleGetLoadingMode", fn);
  CUmoduleLoadingMode mode{};
  const CUresult r = fn(&mode);
  ASYNCTP_CHECK(r == CUDA_SUCCESS, "cuModuleGetLoadingMode failed: ", driver_error_string(static_cast<int>(r)));
  return mode == CU_MODULE_LAZY_LOADING;
}

const char* driver_error_string(int code) {
  using GetErrorString = CUresult (*)(CUresult, const char**);
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult status{};
  const char* text = nullptr;
  if (cudaGetDriverEntryPointByVersion("cuGetErrorString", &fn, kDriverAbi, cudaEnableDefault, &status) ==
          cudaSuccess &&
      fn != nullptr &&
      reinterpret_cast<GetErrorString>(fn)(static_cast<CUresult>(code), &text) == CUDA_SUCCESS && text) {
    return text;
  }
  return "unknown";
}

}  // namespace asynctp::detail
