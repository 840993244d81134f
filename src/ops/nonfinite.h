// Internal: the opt-in scan of an op's inputs for NaN and Inf (ASYNCTP_CHECK_NAN=1).
//
// A NaN that enters a tensor-parallel GEMM spreads to every rank's output through the collective, so
// by the time a loss turns NaN nothing says where it came from. The scan names the rank and the
// tensor before any rank communicates.
#pragma once

#include <cuda_runtime_api.h>

#include <string>
#include <utility>
#include <vector>

#include "asynctp/communicator.h"
#include "asynctp/tensor.h"
#include "common/arg_name.h"

namespace asynctp::ops {

// An op's inputs by the names its errors give them ("a_shard", "bs[0]", ...).
using NamedInputs = std::vector<std::pair<detail::ArgName, TensorRef>>;

// "" where every element of every input (dense, bf16 or fp16) is finite; otherwise a sentence naming
// `op`, the first input holding a NaN or Inf, this rank, how many elements of it are not finite, and
// the first of them with its index. All inputs are scanned with one wait for `stream` (so for the work
// that produces them). "" without scanning while `stream` is being captured into a CUDA graph.
std::string describe_nonfinite(Communicator& comm, const char* op, const NamedInputs& inputs, cudaStream_t stream);

}  // namespace asynctp::ops
