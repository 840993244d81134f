// Kernels with which the one-GPU diagnostics (asynctp-rs-lab, asynctp-gemm-configs) time a call
// without the host's work before its launch: one that holds the GPU while the host enqueues the call,
// and one that stamps the GPU's timer when the GPU reaches it.
#pragma once

#include <cstdint>

#include "kernels/signal.cuh"

// Keeps one SM busy for `ns`: a call enqueued behind it is on the GPU's queue before the GPU reaches
// it. Where `end` is given, stores the global timer as it ends.
static __global__ void spin_for(uint64_t ns, uint64_t* end) {
  const uint64_t t0 = asynctp::kernels::global_timer_ns();
  uint64_t t = t0;
  do {
    t = asynctp::kernels::global_timer_ns();
  } while (t - t0 < ns);
  if (end != nullptr && threadIdx.x == 0) *end = t;
}

// Stores the global timer as the kernel starts: when the GPU was done with what came before it.
static __global__ void stamp_start(uint64_t* at) { *at = asynctp::kernels::global_timer_ns(); }
