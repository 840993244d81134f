// Library version and the NCCL it was built against.
#pragma once

namespace asynctp {

struct Version {
  int major, minor, patch;
};

// This library's version.
Version version();

// NCCL_VERSION_CODE of the headers this library was compiled with (for example 22809 for 2.28.9).
int nccl_build_version();

// ncclGetVersion() of the NCCL library loaded in this process.
int nccl_runtime_version();

// Throws asynctp::Error unless `runtime` == `built`: NCCL's device API has no ABI stability, so a
// kernel built against one NCCL and run on another can read the wrong fields (seen: an illegal
// address with 2.28.9 headers on a 2.28.3 library). Codes are NCCL_VERSION_CODE values.
void check_nccl_versions_match(int runtime, int built);

// Whether (cc_major, cc_minor) is Hopper (9.0), the only architecture the fused (wgmma/TMA) kernels
// are built for.
constexpr bool is_hopper(int cc_major, int cc_minor) { return cc_major == 9 && cc_minor == 0; }

// Throws asynctp::Error naming `what` unless is_hopper(cc_major, cc_minor).
void check_hopper(int cc_major, int cc_minor, const char* gpu_name, int device, const char* what);

}  // namespace asynctp
