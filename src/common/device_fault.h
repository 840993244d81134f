// Internal: where a kernel that gives up leaves its report before it traps.
//
// A trap makes the CUDA context unusable, and device printf output may never be flushed after one, so
// the report is written to pinned, mapped host memory (one record per process, first report wins) and
// joined to the asynctp::Error that the next failing CUDA call raises.
#pragma once

#include <cstdint>
#include <string>

namespace asynctp::detail {

// kSplitReduction: the fused GEMM's last split of a tile waited for the others (index: the tile's
// workspace row; expected: splits - 1; seen: how many had finished).
enum class FaultSite : uint32_t { kNone = 0, kSignalWait = 1, kBarrier = 2, kSplitReduction = 3 };

struct DeviceFault {
  uint32_t raised;     // 0 until a kernel reports; set last, with a system-scope fence before it
  uint32_t site;       // FaultSite
  int32_t rank;        // the rank whose kernel waited
  int32_t owner;       // the rank that owns the flag waited on
  int32_t index;       // the flag's index in its pad
  uint32_t expected;   // the epoch waited for
  uint32_t seen;       // the flag's value when the wait gave up
  uint32_t waited_ms;  // how long it waited
};

// Device-visible pointer to this process's record (allocated on first use). Throws on CUDA failure.
DeviceFault* device_fault_record();

// A sentence describing the reported fault, or "" where no kernel has reported one.
std::string describe_device_fault();

}  // namespace asynctp::detail
