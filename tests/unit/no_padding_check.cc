// Compiled with -Wpadded -Werror (tests/CMakeLists.txt) and never run: padding added to the fused GEMM's
// launch arguments, which kernels/fused/launch_key.h compares byte for byte, fails the build here.
#include "kernels/fused/launch_key.h"
