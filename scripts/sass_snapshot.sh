#!/usr/bin/env bash
# Writes the SASS of every fused GEMM instance of a build to OUT_DIR, one file each, so that a change
# meant to leave the kernels as they are (a refactor, a move between headers) can be shown to: take a
# snapshot before and after, then `diff -r BEFORE AFTER` prints nothing. SASS is deterministic for the
# same source (checked on CUDA 13.0). Needs cuobjdump and nvdisasm on PATH: the CUDA toolkit's, or the
# PyPI wheels nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm (their nvidia/cu13/bin).
# Usage: scripts/sass_snapshot.sh BUILD_DIR OUT_DIR
set -euo pipefail
build=${1:?usage: scripts/sass_snapshot.sh BUILD_DIR OUT_DIR}
out=${2:?usage: scripts/sass_snapshot.sh BUILD_DIR OUT_DIR}
command -v cuobjdump >/dev/null && command -v nvdisasm >/dev/null ||
  { echo "sass_snapshot: cuobjdump and nvdisasm must be on PATH" >&2; exit 2; }
mkdir -p "$out"
n=0
for o in "$build"/CMakeFiles/asynctp_fused_kernels.dir/generated/*.o; do
  cuobjdump -sass "$o" | grep -v '^[[:space:]]*$' >"$out/$(basename "$o" .cu.o).sass"
  n=$((n + 1))
done
[ "$n" -gt 0 ] || { echo "sass_snapshot: no fused instances under $build" >&2; exit 1; }
echo "$n instances written to $out"
