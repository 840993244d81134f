// Internal: a call refused by a binding (the C API, the Python package) before it reaches the op.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "asynctp/communicator.h"

namespace asynctp::ops {

// Shares this rank's refusal of a call of `op` (a public op's name: all_gather_matmul, ...) with
// the other ranks through the agreement the op itself runs, so that they fail at once with "rank R
// refused its arguments" instead of waiting out the timeout; then throws asynctp::Error(`why`) here.
// Where `check_across_ranks` is false, or `stream` is being captured (the op skips the agreement
// there too), it only throws.
[[noreturn]] void refuse_call(Communicator& comm, const char* op, const std::string& why, cudaStream_t stream,
                              bool check_across_ranks);

}  // namespace asynctp::ops
