#include <cublasLt.h>
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include "common/check.h"
#include "common/device_fault.h"
#include "common/driver_api.h"

namespace asynctp::detail {
namespace {
thread_local int t_made_rank = -1;  // the last communicator made on this thread
thread_local int t_call_rank = -1;  // the communicator whose call this thread is in

std::string where(const char* expr, const char* file, int line) {
  return cat(expr, " (", file, ":", line, ")");
}
}  // namespace

void set_thread_rank(int rank) { t_made_rank = rank; }
int current_rank() { return t_call_rank >= 0 ? t_call_rank : t_made_rank; }

RankScope::RankScope(int rank) : outer_(t_call_rank) { t_call_rank = rank; }
RankScope::~RankScope() { t_call_rank = outer_; }

std::string with_rank(const std::string& message) {
  const int rank = current_rank();
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
