#!/usr/bin/env bash
# Before a build folder is carried to the GPU machine: lists object files whose recorded dependencies
# are empty, and fails if there are any. An interrupted compile can leave such a record, and ninja then
# never rebuilds the object however its sources change, so the GPU would run code older than the tree
# (two fused-kernel instantiations once ran hours out of date this way and looked like a kernel bug:
# docs/design/fused_all_gather_matmul.md, Limits).
# Usage: scripts/check_build_deps.sh [BUILD_DIR]   (deletes nothing; remove the listed files and build)
set -euo pipefail
build=${1:-build}
[ -f "$build/build.ninja" ] || { echo "check_build_deps: $build is not a ninja build folder" >&2; exit 2; }
stale=0
while read -r obj; do
  if ninja -C "$build" -t deps "$obj" 2>/dev/null | head -1 | grep -q "#deps 0,"; then
    echo "no recorded dependencies (will never be rebuilt): $build/$obj"
    stale=1
  fi
done < <(ninja -C "$build" -t targets all | sed -n 's/^\(.*\.o\): .*/\1/p')
[ $stale -eq 0 ] && echo "check_build_deps: every object in $build has its dependencies recorded"
exit $stale
