// Internal: ranks agree on an op's arguments before any of them does work.
#pragma once

#include <string>

#include "asynctp/communicator.h"
#include "ops/plan.h"

namespace asynctp::ops {

// Collective. Every rank contributes whether its own validation passed (`local_error` empty) and its
// signature; then, on every rank: throws the local error where this rank's arguments were refused, an
// error naming the refusing rank where another rank's were, or an error naming the first field on which
// two ranks differ. Skipped (local error only) while `stream` is being captured into a CUDA graph.
void agree_across_ranks(Communicator& comm, const char* op, const Signature& signature, const std::string& local_error,
                        cudaStream_t stream);

}  // namespace asynctp::ops
