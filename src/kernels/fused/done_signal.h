// Internal: how a fused kernel tells its peers that it is done with its inbox (the buffer they push
// into), so that their next call may push again.
//
// The last of the kernel's consumer warps to finish raises this rank's done flag in every peer's signal
// pad (a system-scope release store through the peer pointer). A copy enqueued after the kernel would
// do the same a copy-engine round trip later, and the caller's stream would wait for it on every call.
#pragma once

#include <cstdint>

namespace asynctp::kernels::fused {

constexpr int kMaxDonePeers = 7;  // an NVLink domain of 8; larger teams signal from the host

struct DoneSignal {
  int32_t peers = 0;                    // 0: the kernel signals nothing (the host does)
  int32_t unused = 0;                   // no padding (same_launch compares bytes)
  uint32_t* finished = nullptr;         // consumer warps that have finished; 0 at the launch
  const uint32_t* epoch = nullptr;      // the value the flags are raised to
  uint32_t* flag[kMaxDonePeers] = {};   // this rank's done flag in each peer's pad
};

}  // namespace asynctp::kernels::fused
