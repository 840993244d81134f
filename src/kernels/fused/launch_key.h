// Internal: how the fused GEMM finds a launch it has set up before (its TMA descriptors are costly to
// encode on the host): by comparing the arguments byte for byte, so that no field can be left out of
// the comparison. The argument structs have no padding (tests/unit/no_padding_check.cc compiles them
// with -Wpadded -Werror); the one field a launch writes in itself, rs.begin_epoch, is cleared first.
#pragma once

#include <cstring>

#include "kernels/fused/fused_gemm.h"

namespace asynctp::kernels::fused {

// `args` as a kept launch is keyed: rs.begin_epoch (new at every call, written into the kernel's
// parameters at each launch) cleared.
inline FusedGemmArgs launch_key(FusedGemmArgs args) {
  args.rs.begin_epoch = 0;
  return args;
}

// Whether two launches would build the same kernel parameters (the device is fixed per process).
inline bool same_launch(const FusedGemmArgs& x, const FusedGemmArgs& y) {
  const FusedGemmArgs kx = launch_key(x), ky = launch_key(y);
  return std::memcmp(&kx, &ky, sizeof(FusedGemmArgs)) == 0;
}

}  // namespace asynctp::kernels::fused
