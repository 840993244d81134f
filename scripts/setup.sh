#!/usr/bin/env bash
# Sets asynctp up on a fresh machine (Debian/Ubuntu with the CUDA 13 toolkit and NCCL >= 2.28):
#   1. system packages: CMake, Ninja, GoogleTest (apt, where missing);
#   2. CUTLASS 4.2 headers: pip installs nvidia-cutlass==4.2.0.0 into third_party/cutlass (ignored by
#      git), unless CUTLASS_DIR points at headers already; pytest (pip) where missing;
#   3. configure and build into $BUILD_DIR (default: build/).
# Environment: BUILD_DIR, NCCL_ROOT, CUTLASS_DIR, CMAKE_ARGS (extra arguments for configure).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=${BUILD_DIR:-$root/build}
say() { printf 'setup: %s\n' "$*"; }

# 1. System packages.
missing=()
command -v cmake >/dev/null || missing+=(cmake)
command -v ninja >/dev/null || missing+=(ninja-build)
[ -f /usr/include/gtest/gtest.h ] || [ -n "${GTest_DIR:-}" ] || missing+=(libgtest-dev)
if [ ${#missing[@]} -gt 0 ]; then
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    say "installing ${missing[*]} (apt)"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    say "missing ${missing[*]}: install them (apt-get install ${missing[*]}) and run this again" >&2
    exit 1
  fi
fi
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
command -v nvcc >/dev/null || { say "nvcc not found: install the CUDA 13 toolkit (or put its bin/ on PATH)" >&2; exit 1; }

# 2. CUTLASS headers.
cutlass_wheel_dir=$root/third_party/cutlass
if [ -z "${CUTLASS_DIR:-}" ] && [ ! -f "$cutlass_wheel_dir/cutlass_library/source/include/cutlass/version.h" ]; then
  say "installing nvidia-cutlass==4.2.0.0 headers into third_party/cutlass (pip)"
  python3 -m pip install -q --no-deps --disable-pip-version-check --target "$cutlass_wheel_dir" nvidia-cutlass==4.2.0.0
fi

# 2b. pytest, for the Python package's tests (python/tests) that the test command runs.
if ! python3 -c 'import pytest' 2>/dev/null; then
  say "installing pytest (pip)"
  python3 -m pip install -q --disable-pip-version-check pytest
fi

# 3. Configure and build.
say "configuring into $build_dir"
# The Python tests run under the python3 that got pytest above.
# shellcheck disable=SC2086
cmake -S "$root" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPython3_EXECUTABLE="$(command -v python3)" \
  ${CMAKE_ARGS:-}
say "building"
cmake --build "$build_dir" --parallel "$(nproc)"
say "done: tests with 'ctest --test-dir $build_dir --output-on-failure'"
