// Device-side signals for kernels of one's own on asynctp's symmetric memory: acquire loads, release
// stores and a bounded wait on epoch-valued flags. asynctp's own kernels use these same functions.
// Include it from CUDA code (nvcc); it needs nothing else of asynctp.
//
// The rules (docs/design/signals.md explains them):
//  - a producer makes its data visible, then publishes the flag with a release store at the scope of
//    the reader: put_signal, system scope, where the reader may be another GPU;
//  - a waiter spins with acquire loads until flag >= value, compared as a signed difference so that
//    values may wrap past 2^32 (epochs: a flag never needs resetting);
//  - every wait is bounded: past the timeout it writes a report into the communicator's fault record
//    and traps, so a peer that never signals becomes an asynctp.Error on the host instead of a hang.
//    The host reads the report on its next failing call (asynctp_comm_synchronize, any op).
//
// A kernel gets its WaitContext from the host: asynctp_symmetric_get_info's `wait` (C), or a symmetric
// handle's wait_context (Python). docs/reference/symmetric_memory.md has an example kernel.
#pragma once

#include <cstdint>
#include <cstdio>

#include "asynctp/device/wait_context.h"

namespace asynctp::device {

__device__ __forceinline__ uint32_t ld_acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ uint32_t ld_acquire_gpu(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void st_release_sys(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Whether `seen` has reached `expected`, modulo 2^32.
__device__ __forceinline__ bool epoch_reached(uint32_t seen, uint32_t expected) {
  return static_cast<int32_t>(seen - expected) >= 0;
}

// Leaves a report in the fault record (host memory, read by the host's next failing call).
__device__ __forceinline__ void record_timeout(const WaitContext& ctx, WaitSite site, int owner, int index,
                                               uint32_t expected, uint32_t seen, uint64_t waited_ns) {
  Fault* f = ctx.fault;
  // The record is host memory, where atomics may not reach (PCIe), so the first reporter is found by a
  // plain read; two waiters giving up in the same instant could mix fields, which costs only detail.
  if (f != nullptr && *reinterpret_cast<volatile uint32_t*>(&f->raised) == 0u) {
    f->site = static_cast<uint32_t>(site);
    f->rank = ctx.rank;
    f->owner = owner;
    f->index = index;
    f->expected = expected;
    f->seen = seen;
    f->waited_ms = static_cast<uint32_t>(waited_ns / 1000000ull);
    __threadfence_system();
    st_release_sys(&f->raised, 1u);
  }
}

static __device__ __noinline__ void report_timeout_and_trap(const WaitContext& ctx, WaitSite site, int owner,
                                                            int index, uint32_t expected, uint32_t seen,
                                                            uint64_t waited_ns) {
  record_timeout(ctx, site, owner, index, expected, seen, waited_ns);
  printf("asynctp: rank %d: %s timed out after %llu ms: flag %d of rank %d is %u, expected >= %u\n", ctx.rank,
         site == WaitSite::kBarrier ? "barrier wait" : "signal wait",
         static_cast<unsigned long long>(waited_ns / 1000000ull), index, owner, seen, expected);
  __trap();
}

// Spins until *flag >= expected (one thread), then returns what it read. `owner` and `index` only
// label the report. kPrint false: the report goes to the fault record only, with no printf, because
// any function call in a kernel that issues WGMMA makes ptxas serialize the WGMMAs (warning C7510).
template <bool kPrint = true>
__device__ __forceinline__ uint32_t wait_flag_sys(const uint32_t* flag, uint32_t expected, int owner, int index,
                                                  const WaitContext& ctx, WaitSite site = WaitSite::kSignalWait) {
  uint32_t seen = ld_acquire_sys(flag);
  if (epoch_reached(seen, expected)) return seen;
  const uint64_t start = global_timer_ns();
  for (uint32_t spin = 1;; ++spin) {
    seen = ld_acquire_sys(flag);
    if (epoch_reached(seen, expected)) return seen;
    // %globaltimer is read rarely: it is slow compared with a load that hits.
    if ((spin & 255u) == 0u) {
      const uint64_t waited = global_timer_ns() - start;
      if (waited > ctx.timeout_ns) {
        if constexpr (kPrint) {
          report_timeout_and_trap(ctx, site, owner, index, expected, seen, waited);
        } else {
          record_timeout(ctx, site, owner, index, expected, seen, waited);
          __trap();
        }
      }
    }
  }
}

// Publishes `value` in flag `index` of rank `owner`'s pad (pads[owner], from the symmetric handle's
// signal pad pointers): every write this thread made before is visible to a reader that sees the
// value. Where other threads of the block wrote the data, __syncthreads() first.
__device__ __forceinline__ void put_signal(uint32_t* const* pads, int owner, int index, uint32_t value) {
  __threadfence_system();
  st_release_sys(pads[owner] + index, value);
}

// Waits (one thread) until flag `index` of rank `owner`'s pad is at least `value`; past ctx's timeout
// it reports and traps. Other threads of the block wait at a __syncthreads() after it.
__device__ __forceinline__ uint32_t wait_signal(uint32_t* const* pads, int owner, int index, uint32_t value,
                                                const WaitContext& ctx) {
  return wait_flag_sys(pads[owner] + index, value, owner, index, ctx);
}

}  // namespace asynctp::device
