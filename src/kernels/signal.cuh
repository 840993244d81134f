// Internal: the kernels' device-side signalling, which is the public device header's
// (asynctp/device/signals.cuh: acquire loads, release stores and a bounded wait on epoch-valued flags;
// docs/design/signals.md explains the rules).
#pragma once

#include "asynctp/device/signals.cuh"
#include "common/device_fault.h"
#include "kernels/wait_context.h"

namespace asynctp::kernels {

using device::epoch_reached;
using device::global_timer_ns;
using device::ld_acquire_gpu;
using device::ld_acquire_sys;
using device::record_timeout;
using device::st_release_sys;
using device::wait_flag_sys;

}  // namespace asynctp::kernels
