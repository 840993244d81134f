// Device-side signalling: acquire loads, release stores and a bounded wait on epoch-valued flags.
//
// Rules the kernels follow (docs/design/signals.md explains them):
//  - a producer makes its data visible, then publishes the flag with a release store at the scope of
//    the reader (system scope when the reader is another GPU);
//  - a waiter spins with acquire loads until flag >= epoch, compared as a signed difference so that
//    epochs may wrap;
//  - every wait is bounded: past the timeout it writes a report (common/device_fault.h), prints it, and
//    traps, so a missing peer becomes an error on the host instead of a hang.
#pragma once

#include <cstdint>
#include <cstdio>

#include "common/device_fault.h"
#include "kernels/wait_context.h"

namespace asynctp::kernels {

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

__device__ __forceinline__ bool epoch_reached(uint32_t seen, uint32_t expected) {
  return static_cast<int32_t>(seen - expected) >= 0;
}

// Leaves the report in the process's fault record (host memory, read by the next failing CUDA call).
__device__ __forceinline__ void record_timeout(const WaitContext& ctx, detail::FaultSite site, int owner, int index,
                                               uint32_t expected, uint32_t seen, uint64_t waited_ns) {
  detail::DeviceFault* f = ctx.fault;
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

static __device__ __noinline__ void report_timeout_and_trap(const WaitContext& ctx, detail::FaultSite site,
                                                            int owner, int index, uint32_t expected, uint32_t seen,
                                                            uint64_t waited_ns) {
  record_timeout(ctx, site, owner, index, expected, seen, waited_ns);
  printf("asynctp: rank %d: %s timed out after %llu ms: flag %d of rank %d is %u, expected >= %u\n", ctx.rank,
         site == detail::FaultSite::kBarrier ? "barrier wait" : "signal wait",
         static_cast<unsigned long long>(waited_ns / 1000000ull), index, owner, seen, expected);
  __trap();
}

// Spins until *flag >= expected (one thread). `owner` and `index` only label the report. kPrint false:
// the report goes to the fault record only, with no printf, because any function call in a kernel
// that issues WGMMA makes ptxas serialize the WGMMAs (warning C7510).
template <bool kPrint = true>
__device__ __forceinline__ uint32_t wait_flag_sys(const uint32_t* flag, uint32_t expected, int owner, int index,
                                                  const WaitContext& ctx,
                                                  detail::FaultSite site = detail::FaultSite::kSignalWait) {
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

}  // namespace asynctp::kernels
