#!/usr/bin/env bash
# On the 2-GPU machine: the fused reduce-scatter's ways of moving its staged tiles, side by side in one
# call, alternating so that drift (clocks, power, temperature) falls on every way alike:
#   copy-engine        the default: staged in this GPU's memory, moved by the copy engine (fixup()'s
#                      reduction below five rounds of tiles, the epilogue's from there);
#   kernel             ASYNCTP_FUSED_RS_PUSH=kernel: where the reduction is in the epilogue, the
#                      kernel's TMA stores push the staged tiles into the peer's inbox itself;
#   kernel-epilogue    the same with ASYNCTP_FUSED_RS_REDUCE=epilogue: pushed from the kernel at every
#                      shape, the small ones included.
# Prints the fused (and pipelined) medians per way and shape (scripts/tables/ab_table.py); the JSON of every
# run goes to $OUT (or /tmp/asynctp-out). docs/design/fused_matmul_reduce_scatter.md, "Pushed from the kernel".
# Usage: scripts/gpu/rs_push_ab.sh [BUILD_DIR] [ROUNDS] [BENCH_ARGS...]
#   default bench arguments: --gpus 2 --shapes seeds --op rs --algorithms pipelined,fused --iters 40
set -uo pipefail
build=${1:-build}
rounds=${2:-2}
shift 2 || shift $#
bench_args=("$@")
[ ${#bench_args[@]} -gt 0 ] || bench_args=(--gpus 2 --shapes seeds --op rs --algorithms pipelined,fused --iters 40)
out=${OUT:-/tmp/asynctp-out}
mkdir -p "$out"
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"

status=0
tables=()
for round in $(seq 1 "$rounds"); do
  for way in copy-engine kernel kernel-epilogue; do
    case $way in
      copy-engine) env=(ASYNCTP_FUSED_RS_PUSH=copy-engine) ;;
      kernel) env=(ASYNCTP_FUSED_RS_PUSH=kernel) ;;
      kernel-epilogue) env=(ASYNCTP_FUSED_RS_PUSH=kernel ASYNCTP_FUSED_RS_REDUCE=epilogue) ;;
    esac
    json=$out/ab_${way}_$round.json
    echo "== round $round: $way (${env[*]})"
    env "${env[@]}" "$build/tools/asynctp-bench" "${bench_args[@]}" --json "$json" >"$out/ab_${way}_$round.txt" \
      2>"$out/ab_${way}_$round.err" || { status=1; tail -5 "$out/ab_${way}_$round.err"; }
    tables+=("$way=$json")
  done
done
python3 "$(dirname "${BASH_SOURCE[0]}")/../tables/ab_table.py" "${tables[@]}" | tee "$out/ab_table.md"
exit $status
