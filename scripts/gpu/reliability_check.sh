#!/usr/bin/env bash
# On the 2-GPU machine: the runs behind docs/design/reliability.md, from a build carried there.
# Usage: scripts/gpu/reliability_check.sh BUILD_DIR STAGE...   (logs go to $OUT, or /tmp/asynctp-out)
#   tests      the fault and edge-input GPU tests (Faults.*, Inputs.*)
#   soak N     asynctp-soak: N calls per op and algorithm (100000 for the record)
#   sanitize   compute-sanitizer memcheck, racecheck and synccheck on 2-rank soaks of every
#              algorithm and both ops (few calls: the tools slow kernels down 10-1000x; each tool's
#              run is cut at $SANITIZE_TIMEOUT_S seconds, default 600; $SANITIZE_TOOLS picks tools)
set -uo pipefail
build=${1:?usage: scripts/gpu/reliability_check.sh BUILD_DIR STAGE...}
shift
out=${OUT:-/tmp/asynctp-out}
mkdir -p "$out"
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader
status=0
while [ $# -gt 0 ]; do
  stage=$1
  shift
  case $stage in
    tests)
      echo "== fault and edge-input tests"
      "$build/tests/asynctp_gpu_tests" --gtest_filter='Faults.*:Inputs.*' 2>&1 | tee "$out/faults.log" \
        | grep -E "^\[ +(OK|FAILED|SKIPPED|PASSED) |after|refused|Failure|exits mid|killed mid|never calls|right past" || true
      grep -q "^\[  PASSED  \]" "$out/faults.log" && ! grep -q "^\[  FAILED  \]" "$out/faults.log" || status=1
      ;;
    soak)
      calls=${1:?soak needs a call count}
      shift
      echo "== asynctp-soak --calls $calls"
      "$build/tools/asynctp-soak" --gpus 2 --calls "$calls" --json "$out/soak.json" 2>"$out/soak.err" \
        | tee "$out/soak.txt" || status=1
      tail -5 "$out/soak.err"
      ;;
    sanitize)
      # The waits of a slowed-down peer must not time out under the tools.
      export ASYNCTP_TIMEOUT_MS=300000
      for tool in ${SANITIZE_TOOLS:-memcheck synccheck racecheck}; do
        echo "== compute-sanitizer --tool $tool"
        calls=12
        [ $tool = racecheck ] && calls=4
        # memcheck: device memory errors only; NCCL's start-up probes for kernels of other GPUs fail
        # on purpose (cudaErrorNoKernelImageForDevice), which API-error reporting would count.
        extra=()
        [ $tool = memcheck ] && extra=(--report-api-errors no)
        timeout "${SANITIZE_TIMEOUT_S:-600}" compute-sanitizer --tool $tool --target-processes all --error-exitcode 9 --print-limit 100 "${extra[@]}" \
          "$build/tools/asynctp-soak" --gpus 2 --calls $calls --check-every 2 --max-dim 512 \
          --max-growth-mib 100000 >"$out/sanitize_$tool.log" 2>&1
        rc=$?
        echo "exit $rc"
        [ $rc -eq 0 ] || status=1
        grep -E "ERROR SUMMARY|RACECHECK SUMMARY|^[a-z_]+ +[a-z]+ +[0-9]+|=========" "$out/sanitize_$tool.log" | head -30
      done
      ;;
    *)
      echo "unknown stage '$stage'" >&2
      exit 2
      ;;
  esac
done
exit $status
