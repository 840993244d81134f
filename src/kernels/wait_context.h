// Internal: what a bounded wait in a kernel needs to know, passed by value from the host.
#pragma once

#include <cstdint>

#include "common/device_fault.h"

namespace asynctp::kernels {

struct WaitContext {
  detail::DeviceFault* fault;  // where a timeout is reported
  uint64_t timeout_ns;
  int32_t rank;  // the waiting rank, for the report
  int32_t unused = 0;  // no padding: launch arguments are compared byte for byte (same_launch)
};

}  // namespace asynctp::kernels
