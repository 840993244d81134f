#include <nccl.h>

#include "asynctp/version.h"
#include "common/check.h"

namespace asynctp {
namespace {
std::string nccl_version_text(int code) {
  // NCCL_VERSION_CODE is X*10000 + Y*100 + Z since 2.9.
  return detail::cat(code / 10000, ".", (code % 10000) / 100, ".", code % 100);
}
}  // namespace

Version version() { return {0, 1, 0}; }

int nccl_build_version() { return NCCL_VERSION_CODE; }

int nccl_runtime_version() {
  int v = 0;
  ASYNCTP_NCCL_CHECK(ncclGetVersion(&v));
  return v;
}

void check_nccl_versions_match(int runtime, int built) {
  ASYNCTP_CHECK(runtime == built, "the NCCL library loaded at run time is ", nccl_version_text(runtime),
                " but asynctp was built with NCCL ", nccl_version_text(built),
                " headers; NCCL's device API has no stable ABI, so they must match. Put the NCCL asynctp was "
                "built against first in LD_LIBRARY_PATH, or rebuild asynctp with NCCL_ROOT pointing at the "
                "NCCL you run with.");
}

void check_hopper(int cc_major, int cc_minor, const char* gpu_name, int device, const char* what) {
  ASYNCTP_CHECK(is_hopper(cc_major, cc_minor), what, " needs a Hopper GPU (compute capability 9.0: H100, H200); ",
                "GPU ", device, " (", gpu_name ? gpu_name : "unknown", ") has compute capability ", cc_major, ".",
                cc_minor, ". Use algorithm 'sequential' or 'pipelined' on this GPU.");
}

}  // namespace asynctp
