// Internal: the stream-ordered barrier on epoch-valued flags that Communicator::barrier and the
// in-process transport's collectives use.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/wait_context.h"

namespace asynctp::comm {

// Enqueues on `stream` a barrier over `n` ranks: flag p of rank q's pad (pads[q]) holds the last barrier
// epoch rank p reached, and `epoch` (device memory) is this rank's count of barriers, advanced on the GPU
// so that a captured CUDA graph counts on at every replay. Work after it on `stream` starts once every
// rank's work before its own barrier has finished. Every wait is bounded by `ctx`.
void enqueue_barrier(uint32_t* const* pads, uint32_t* epoch, int me, int n, const kernels::WaitContext& ctx,
                     cudaStream_t stream);

}  // namespace asynctp::comm
