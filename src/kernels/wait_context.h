// Internal: what a bounded wait in a kernel needs to know, passed by value from the host: the public
// device header's (asynctp/device/wait_context.h).
#pragma once

#include "asynctp/device/wait_context.h"

namespace asynctp::kernels {

using WaitContext = device::WaitContext;

}  // namespace asynctp::kernels
