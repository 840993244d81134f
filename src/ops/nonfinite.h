// Internal: the opt-in scan of an op's inputs for NaN and Inf (ASYNCTP_CHECK_NAN=1).
//
// A NaN that enters a tensor-parallel GEMM spreads to every rank's output through the collective, so
// by the time a loss turns NaN nothing says where it came from. The scan names the rank and the
// tensor before any rank communicates.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "asynctp/communicator.h"
#include "asynctp/tensor.h"

namespace asynctp::ops {

// "" where every element of `t` (dense, bf16 or fp16) is finite; otherwise a sentence naming `op`,
// `name`, this rank, how many elements are not finite, and the first of them with its index. Waits
// for `stream` (so for the work that produces `t`); not to be called while `stream` is captured.
std::string describe_nonfinite(Communicator& comm, const char* op, const char* name, const TensorRef& t,
                               cudaStream_t stream);

}  // namespace asynctp::ops
