// Internal: where a kernel that gives up leaves its report before it traps.
//
// A trap makes the CUDA context unusable, and device printf output may never be flushed after one, so
// the report is written to pinned, mapped host memory (one record per process, first report wins) and
// joined to the asynctp::Error that the next failing CUDA call raises.
#pragma once

#include <cstdint>
#include <string>

#include "asynctp/device/wait_context.h"

namespace asynctp::detail {

// The record and its sites are the public device header's (asynctp/device/wait_context.h).
using DeviceFault = device::Fault;
using FaultSite = device::WaitSite;

// Device-visible pointer to this process's record (allocated on first use). Throws on CUDA failure.
DeviceFault* device_fault_record();

// A sentence describing the reported fault: a kernel's, else the host's (report_host_fault), else "".
std::string describe_device_fault();

// Records a fault found on the host that ends this process's CUDA context (a communicator's watchdog,
// comm/watchdog.h), for describe_device_fault. The first report stays.
void report_host_fault(const std::string& report);

}  // namespace asynctp::detail
