#include <cublasLt.h>
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>

#include "common/check.h"
#include "common/device_fault.h"
#include "common/driver_api.h"

namespace asynctp::detail {
namespace {
std::atomic<int> g_rank{-1};
// The rank of the calling thread where it set one: the ranks of an in-process group are threads of
// one process.
thread_local int t_rank = -1;

std::string where(const char* expr, const char* file, int line) {
  return cat(expr, " (", file, ":", line, ")");
}
}  // namespace

void set_process_rank(int rank) {
  g_rank.store(rank);
  t_rank = rank;
}
int process_rank() { return t_rank >= 0 ? t_rank : g_rank.load(); }

std::string with_rank(const std::string& message) {
  const int rank = process_rank();
  return rank >= 0 ? cat("rank ", rank, ": ", message) : message;
}

void raise(const std::string& message) { throw Error(with_rank(message)); }

void raise_cuda(int code, const char* expr, const char* file, int line) {
  const auto err = static_cast<cudaError_t>(code);
  // A kernel that gave up waiting leaves its report in host memory before it traps; the failure
  // surfaces here, at the next CUDA call, so this is where the report joins the message.
  const std::string fault = describe_device_fault();
  raise(cat(where(expr, file, line), " failed: ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ")",
            fault.empty() ? "" : "; ", fault));
}

void raise_driver(int code, const char* expr, const char* file, int line) {
  raise(cat(where(expr, file, line), " failed: CUDA driver error ", code, " (", driver_error_string(code), ")"));
}

void raise_nccl(int code, const char* expr, const char* file, int line) {
  const auto res = static_cast<ncclResult_t>(code);
  raise(cat(where(expr, file, line), " failed: ", ncclGetErrorString(res),
            res == ncclUnhandledCudaError ? "; a CUDA call inside NCCL failed (run with NCCL_DEBUG=WARN)" : ""));
}

void raise_cublas(int code, const char* expr, const char* file, int line) {
  raise(cat(where(expr, file, line), " failed: cuBLAS status ", code, " (",
            cublasLtGetStatusName(static_cast<cublasStatus_t>(code)), ")"));
}

}  // namespace asynctp::detail
