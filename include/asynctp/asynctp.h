// asynctp: tensor-parallel GEMMs that hide their communication on NVLink-connected GPUs.
// The umbrella header: everything a user of the host API needs. The launcher (asynctp/launcher.h),
// which forks ranks for tests and tools, is included on its own.
#pragma once

#include "asynctp/communicator.h"
#include "asynctp/error.h"
#include "asynctp/in_process.h"
#include "asynctp/ops.h"
#include "asynctp/scaled_ops.h"
#include "asynctp/signal.h"
#include "asynctp/symmetric.h"
#include "asynctp/tensor.h"
#include "asynctp/version.h"
