// What a bounded wait in a kernel needs from the host, and the record it leaves when it gives up.
// Plain C++ (no CUDA needed): the host side passes a WaitContext to kernels that include
// asynctp/device/signals.cuh.
#pragma once

#include <cstdint>

namespace asynctp::device {

// What a wait that gave up reports. kSplitReduction is the fused GEMM's own (its last split of a
// tile waited for the others).
enum class WaitSite : uint32_t { kNone = 0, kSignalWait = 1, kBarrier = 2, kSplitReduction = 3 };

// The fault record a wait writes before it traps: pinned host memory mapped into the device, one per
// process, the first report wins.
struct Fault {
  uint32_t raised;     // 0 until a kernel reports; set last, with a system-scope fence before it
  uint32_t site;       // WaitSite
  int32_t rank;        // the rank whose kernel waited
  int32_t owner;       // the rank that owns the flag waited on
  int32_t index;       // the flag's index in its pad
  uint32_t expected;   // the value waited for
  uint32_t seen;       // the flag's value when the wait gave up
  uint32_t waited_ms;  // how long it waited
};

// What a bounded wait needs, passed by value from the host. Laid out as asynctp_wait_context (C).
struct WaitContext {
  Fault* fault;         // where a timeout is reported
  uint64_t timeout_ns;  // the communicator's timeout
  int32_t rank;         // the waiting rank, for the report
  int32_t unused = 0;   // no padding: launch arguments are compared byte for byte
};

}  // namespace asynctp::device
