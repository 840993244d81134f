#include "common/device_fault.h"

#include <cuda_runtime_api.h>

#include <mutex>
#include <string>

#include "common/check.h"

namespace asynctp::detail {
namespace {
DeviceFault* g_record = nullptr;  // host-mapped; the same address is valid on the device (UVA)
std::once_flag g_once;
std::mutex g_host_mutex;
std::string g_host_report;  // report_host_fault's first
}  // namespace

void report_host_fault(const std::string& report) {
  const std::lock_guard<std::mutex> lock(g_host_mutex);
  if (g_host_report.empty()) g_host_report = report;
}

DeviceFault* device_fault_record() {
  std::call_once(g_once, [] {
    void* p = nullptr;
    ASYNCTP_CUDA_CHECK(cudaHostAlloc(&p, sizeof(DeviceFault), cudaHostAllocMapped | cudaHostAllocPortable));
    *static_cast<DeviceFault*>(p) = DeviceFault{};
    g_record = static_cast<DeviceFault*>(p);
  });
  return g_record;
}

std::string describe_device_fault() {
  const volatile DeviceFault* record = g_record;  // written by kernels: read through volatile
  if (record == nullptr || record->raised == 0) {
    const std::lock_guard<std::mutex> lock(g_host_mutex);
    return g_host_report;
  }
  const volatile DeviceFault& f = *record;
  const char* remedy =
      " (a peer did not arrive: it failed, was not started, or is running a different op; "
      "ASYNCTP_TIMEOUT_MS sets the bound)";
  if (static_cast<FaultSite>(f.site) == FaultSite::kBarrier) {
    return cat("a barrier on rank ", f.rank, " timed out after ", f.waited_ms, " ms: LSA rank ", f.index,
               " did not arrive (its flag is ", f.seen, ", expected >= ", f.expected, ")", remedy);
  }
  if (static_cast<FaultSite>(f.site) == FaultSite::kSplitReduction) {
    return cat("the fused GEMM on rank ", f.rank, " timed out after ", f.waited_ms,
               " ms adding the partial sums of split tile ", f.index, ": ", f.seen, " of ", f.expected,
               " other splits had finished (a bug in asynctp: please report it)");
  }
  return cat("a signal wait on rank ", f.rank, " timed out after ", f.waited_ms, " ms: flag ", f.index, " of rank ",
             f.owner, " is ", f.seen, ", expected >= ", f.expected, remedy);
}

}  // namespace asynctp::detail
