// Built against the installed tree only: the umbrella header, the launcher's and the C API's compile,
// and the library links and answers without a GPU.
#include <asynctp/asynctp.h>
#include <asynctp/c_api.h>
#include <asynctp/launcher.h>

#include <cstdio>

int main() {
  const asynctp::Version v = asynctp::version();
  std::printf("asynctp %d.%d.%d, built against NCCL %d, algorithm %s\n", v.major, v.minor, v.patch,
              asynctp::nccl_build_version(), asynctp::algorithm_name(asynctp::Algorithm::kFused));
  return v.major == 0 && v.minor == 1 ? 0 : 1;
}
