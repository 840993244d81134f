#!/usr/bin/env bash
# On the GPU machine: runs the CPU tests, the GPU tests, asynctp-p2p, asynctp-bench beside
# bench/torch_anchor.py (PyTorch's own paths, same run), and the Python package's tests, example and
# bench/compare_torch.py, from a build made on the development machine
# (carried there), against the NCCL it was built with. Logs go to $OUT (or /tmp/asynctp-out).
# Usage: scripts/gpu/gpu_check.sh [BUILD_DIR] [BENCH_ARGS...]
#
# The development machine builds against NCCL 2.28.9; on the GPU machine that version is PyTorch's
# (site-packages/nvidia/nccl), while the system NCCL is 2.28.3, which asynctp refuses (no stable
# device ABI). NVLink multicast stays off on these machines.
set -uo pipefail
build=${1:-build}
shift || true
bench_args=("$@")
[ ${#bench_args[@]} -gt 0 ] || bench_args=(--shapes seeds --op both --algorithms sequential,pipelined)
out=${OUT:-/tmp/asynctp-out}
mkdir -p "$out"

source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
echo "== machine"
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader
nvidia-smi topo -m | head -4
ldd "$build/tests/asynctp_gpu_tests" | grep -E "nccl|cublas"

status=0
echo "== CPU tests"
"$build/tests/asynctp_unit_tests" >"$out/unit.log" 2>&1 || status=1
tail -3 "$out/unit.log"
echo "== GPU tests"
"$build/tests/asynctp_gpu_tests" 2>&1 | tee "$out/gpu.log" | grep -E "^\[ +(OK|FAILED|SKIPPED|PASSED) |drift|Failure|failed|Skipped" || true
grep -q "^\[  PASSED  \]" "$out/gpu.log" && ! grep -q "^\[  FAILED  \]" "$out/gpu.log" || status=1
echo "== asynctp-p2p (3 runs)"
for i in 1 2 3; do
  "$build/tools/asynctp-p2p" --mib 64 --iters 50 --json "$out/p2p_$i.json" || status=1
done
echo "== asynctp-bench ${bench_args[*]}"
"$build/tools/asynctp-bench" "${bench_args[@]}" --json "$out/bench.json" 2>"$out/bench.err" | tee "$out/bench.txt" || status=1
tail -3 "$out/bench.err"
echo "== torch_anchor.py (same run)"
if command -v torchrun >/dev/null; then
  torchrun --nproc-per-node "$(nvidia-smi -L | wc -l)" bench/torch_anchor.py 2>&1 | grep -v "^W\|^\[W" | tee "$out/torch_anchor.txt"
fi
echo "== Python package: pytest, examples/llama_mlp.py, bench/compare_torch.py (same run)"
if python3 -c 'import torch, pytest' 2>/dev/null; then
  export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH} ASYNCTP_LIBRARY=$PWD/$build/libasynctp_c.so
  python3 -m pytest -q -rs -p no:cacheprovider python/tests 2>&1 | tee "$out/pytest.log" | tail -5
  grep -qE "^[0-9]+ passed" "$out/pytest.log" && ! grep -qE "[0-9]+ (failed|errors?)" "$out/pytest.log" || status=1
  ranks=$(nvidia-smi -L | wc -l)
  torchrun --nproc-per-node "$ranks" examples/llama_mlp.py 2>&1 | grep -v "^W\|^\[W" | tee "$out/llama_mlp.txt" || status=1
  torchrun --nproc-per-node "$ranks" bench/compare_torch.py --json "$out/compare_torch.json" 2>&1 \
    | grep -v "^W\|^\[W\|FutureWarning\|enable_symm_mem" | tee "$out/compare_torch.txt" || status=1
else
  echo "PyTorch or pytest missing here: the Python package was not checked"
fi
exit $status
