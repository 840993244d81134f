#!/usr/bin/env bash
# On a GPU machine: the checks behind docs/design/reliability.md and the one-GPU A/B, from a build
# carried there. With two or more GPUs the ranks are processes on NCCL, one a GPU; with one GPU they
# are threads of one process on it (the in-process transport). Logs go to $OUT (or /tmp/asynctp-out).
# Usage: scripts/gpu/stages.sh BUILD_DIR STAGE...
#   tests          every GPU test; the multi-rank ones at world sizes $WORLD_SIZES (default: 2,3,4 on
#                  one GPU, in-process; else the tests' own), $GTEST_FILTER picks tests
#   transports     every GPU test on NCCL (a suite at a time over every GPU) and then in-process (a
#                  suite at a time on each GPU), at world sizes $WORLD_SIZES (default 2), each cut at
#                  $TESTS_TIMEOUT_S; $GTEST_FILTER picks tests, $TRANSPORTS transports (default
#                  "nccl in-process"); scripts/gpu/compare_outcomes.py then names every test whose
#                  outcome differs (two or more GPUs); logs and googletest reports
#                  nccl_<suite>.{log,json}, in-process_<suite>.{log,json}
#   one-gpu-each   every GPU test in-process on one GPU, at world sizes $WORLD_SIZES (default 2,3,4),
#                  a test suite per GPU at a time on every GPU of the machine, the longest suites
#                  first (a suite per log, one_gpu_<suite>.log); $GTEST_FILTER picks tests,
#                  $TESTS_TIMEOUT_S bounds the stage
#   repeat N       $GTEST_FILTER in-process on one GPU at world sizes $WORLD_SIZES (default 2,3,4), N
#                  runs spread over every GPU of the machine; prints how many failed, and the timeout
#                  reports of those that did (repeat_<gpu>_<run>.log)
#   examples       asynctp-example-all-reduce (examples/one_shot_all_reduce.cuh) at 2 and 4 ranks
#   faults         the fault and edge-input tests (Faults.*, Inputs.*, Refusals.*)
#   soak N         asynctp-soak: N calls per op and algorithm, on 2 ranks
#   sanitize       compute-sanitizer memcheck, racecheck and synccheck on 2-rank soaks of every
#                  algorithm and both ops (few calls: the tools slow kernels down 10-1000x), and
#                  initcheck on the fused ones; each tool's run is cut at $SANITIZE_TIMEOUT_S seconds
#                  (default 600); $SANITIZE_TOOLS picks tools
#   python         the Python package's tests (pytest python/tests, PyTorch's NCCL), cut at
#                  $PYTEST_TIMEOUT_S seconds (default 560)
#   ab BASE_DIR N  asynctp-bench --gpus 1 at the seed shapes, BASE_DIR's build and BUILD_DIR's in turn,
#                  N times each (the fused kernel as a GEMM alone beside cuBLAS)
#   bench          asynctp-bench on every GPU at the seed shapes, both ops: bf16 with every algorithm and
#                  auto, then e4m3 with tensor-wise scales (sequential, pipelined, auto), with them and
#                  fast accumulation (fused too), and with row-wise scales, then bench/torch_anchor.py
#                  (PyTorch's own paths) in the same call (bench_<kind>.txt and .json, torch_anchor.txt)
#   torch          the PyTorch paths with torchrun on every GPU (one rank each, at least 1):
#                  examples/two_ways_in.py (compile switch and DTensor styles against one GPU),
#                  bench/binding_overhead.py at that world size and at 1 (there twice with the torch ops
#                  registered in C++ and in Python, alternating), bench/communicator_cost.py,
#                  bench/compiled_tp.py (a TP MLP compiled by inductor alone, with PyTorch's async TP, with asynctp's),
#                  examples/triton_all_gather_matmul.py at 1 and at that world size
set -uo pipefail
build=${1:?usage: scripts/gpu/stages.sh BUILD_DIR STAGE...}
shift
out=${OUT:-/tmp/asynctp-out}
mkdir -p "$out"
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader
gpus=$(nvidia-smi -L | wc -l)
# nvidia-smi lists every GPU; CUDA_VISIBLE_DEVICES narrows what the programs see.
[ -z "${CUDA_VISIBLE_DEVICES:-}" ] || gpus=$(echo "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c .)
# Two ranks: one a GPU where there are two, else both on the one GPU.
two_ranks=(--gpus 2)
[ "$gpus" -ge 2 ] || two_ranks=(--gpus 1 --ranks-per-gpu 2)
status=0

# Runs the GPU tests into $out/$1.log with the rest as arguments, and prints the outcome.
gpu_tests() {
  local log=$out/$1.log
  shift
  timeout "${TESTS_TIMEOUT_S:-560}" "$build/tests/asynctp_gpu_tests" "$@" >"$log" 2>&1
  echo "exit $?"
  grep -E "^\[ +(FAILED|SKIPPED|PASSED) |^\[==========\]|Failure|world size [0-9]+ (failed|not run)" "$log" | head -60
  grep -q "^\[  PASSED  \]" "$log" && ! grep -q "^\[  FAILED  \]" "$log" || status=1
}

# The visible GPUs' indices, space-separated.
gpu_list=$(echo "${CUDA_VISIBLE_DEVICES:-$(nvidia-smi --query-gpu=index --format=csv,noheader)}" | tr ',' '\n' | paste -sd' ')

# Writes to $1 a line per test suite, "Suite Suite.TestA:Suite.TestB", the longest suites first (minutes
# each at world sizes 2-4), so that none starts last alone; $GTEST_FILTER picks tests.
list_suites() {
  "$build/tests/asynctp_gpu_tests" --gtest_list_tests ${GTEST_FILTER:+--gtest_filter=$GTEST_FILTER} \
    | awk '/^[^ ]+\.( |$)/ { if (s != "") print s, t; s = $1; sub(/\.$/, "", s); t = "" }
           /^  / { t = t (t == "" ? "" : ":") s "." $1 }
           END { if (s != "") print s, t }' >"$1.listed"
  local long="FusedOps PipelinedOps SequentialOps Faults AutoOps Concurrency Inputs"
  for suite in $long; do grep "^$suite " "$1.listed"; done >"$1"
  grep -v -E "^(${long// /|}) " "$1.listed" >>"$1"
}

# Runs the suites of queue file $2 on transport $1 at world sizes $sizes until $deadline, a worker per
# further argument (the CUDA_VISIBLE_DEVICES it runs with) taking the next suite until none is left; a
# log and a googletest report per suite, $out/$3_<suite>.{log,json}. Fails where a suite failed, ended
# before its summary, or was not reached.
run_suites() {
  local transport=$1 queue=$2 prefix=$3
  shift 3
  for devices in "$@"; do
    (
      while [ $SECONDS -lt $deadline ]; do
        line=$(flock "$queue.lock" sh -c 'head -1 "$1"; sed -i 1d "$1"' _ "$queue")
        [ -n "$line" ] || break
        read -r suite filter <<<"$line"
        CUDA_VISIBLE_DEVICES=$devices ASYNCTP_TEST_TRANSPORT=$transport ASYNCTP_TEST_WORLD_SIZES=$sizes \
          timeout $((deadline - SECONDS)) "$build/tests/asynctp_gpu_tests" --gtest_filter="$filter" \
          --gtest_output="json:$out/${prefix}_$suite.json" >"$out/${prefix}_$suite.log" 2>&1
        echo "$suite on GPU $devices: exit $?"
      done
    ) &
  done
  wait
  local logs=("$out/${prefix}"_*.log)
  [ -s "$queue" ] && { echo "not reached: $(cut -d' ' -f1 "$queue" | tr '\n' ' ')"; status=1; }
  grep -h -E "^\[  FAILED  \] [A-Z]" "${logs[@]}" | sort -u | head -40
  ! grep -q -E "^\[  FAILED  \]" "${logs[@]}" || status=1
  grep -L -E "^\[  PASSED  \]" "${logs[@]}" | sed 's/^/ended before its summary: /'
  [ -z "$(grep -L -E "^\[  PASSED  \]" "${logs[@]}")" ] || status=1
}

while [ $# -gt 0 ]; do
  stage=$1
  shift
  case $stage in
    tests)
      sizes=${WORLD_SIZES:-}
      [ -n "$sizes" ] || [ "$gpus" -ge 2 ] || sizes=2,3,4
      echo "== GPU tests${sizes:+, world sizes $sizes}"
      [ -z "$sizes" ] || export ASYNCTP_TEST_WORLD_SIZES=$sizes
      gpu_tests gpu ${GTEST_FILTER:+--gtest_filter=$GTEST_FILTER}
      ;;
    transports)
      sizes=${WORLD_SIZES:-2}
      for transport in ${TRANSPORTS:-nccl in-process}; do
        echo "== GPU tests on $transport, world sizes $sizes"
        list_suites "$out/${transport}_queue"
        deadline=$((SECONDS + ${TESTS_TIMEOUT_S:-560}))
        if [ $transport = nccl ]; then
          run_suites nccl "$out/${transport}_queue" nccl "${gpu_list// /,}"
        else
          # shellcheck disable=SC2086  # a worker per GPU
          run_suites in-process "$out/${transport}_queue" in-process $gpu_list
        fi
      done
      [ "${TRANSPORTS:-nccl in-process}" != "nccl in-process" ] \
        || python3 "$(dirname "${BASH_SOURCE[0]}")/compare_outcomes.py" --nccl "$out"/nccl_*.json \
          --in-process "$out"/in-process_*.json || status=1
      ;;
    one-gpu-each)
      sizes=${WORLD_SIZES:-2,3,4}
      echo "== GPU tests in-process on one GPU each, world sizes $sizes"
      list_suites "$out/one_gpu_queue"
      deadline=$((SECONDS + ${TESTS_TIMEOUT_S:-560}))
      # shellcheck disable=SC2086  # a worker per GPU
      run_suites in-process "$out/one_gpu_queue" one_gpu $gpu_list
      ;;
    repeat)
      runs=${1:?repeat needs a run count}
      shift
      sizes=${WORLD_SIZES:-2,3,4}
      echo "== ${GTEST_FILTER:?repeat needs GTEST_FILTER} in-process, world sizes $sizes, $runs runs over the GPUs"
      n_gpus=$(echo $gpu_list | wc -w)
      i=0
      for gpu in $gpu_list; do
        (
          for run in $(seq $((i + 1)) "$n_gpus" "$runs"); do
            CUDA_VISIBLE_DEVICES=$gpu ASYNCTP_TEST_TRANSPORT=in-process ASYNCTP_TEST_WORLD_SIZES=$sizes \
              timeout "${TESTS_TIMEOUT_S:-560}" "$build/tests/asynctp_gpu_tests" --gtest_filter="$GTEST_FILTER" \
              >"$out/repeat_${gpu}_$run.log" 2>&1
          done
        ) &
        i=$((i + 1))
      done
      wait
      failed=$(grep -L -E "^\[  PASSED  \]" "$out"/repeat_*.log; grep -l -E "^\[  FAILED  \]" "$out"/repeat_*.log)
      failed=$(echo "$failed" | grep . | sort -u)
      echo "$(echo "$failed" | grep -c .) of $runs runs failed"
      for f in $failed; do echo "$f:"; grep -h "timed out" "$f" | head -3; done
      [ -z "$failed" ] || status=1
      ;;
    examples)
      echo "== asynctp-example-all-reduce at 2 and 4 ranks (threads over the visible GPUs)"
      for ranks in 2 4; do
        timeout 120 "$build/asynctp-example-all-reduce" "$ranks" || status=1
      done
      ;;
    faults)
      echo "== fault and edge-input tests"
      gpu_tests faults --gtest_filter='Faults.*:Inputs.*:Refusals.*'
      ;;
    soak)
      calls=${1:?soak needs a call count}
      shift
      echo "== asynctp-soak ${two_ranks[*]} --calls $calls"
      "$build/tools/asynctp-soak" "${two_ranks[@]}" --calls "$calls" --json "$out/soak.json" 2>"$out/soak.err" \
        | tee "$out/soak.txt" | tail -12 || status=1
      tail -4 "$out/soak.err"
      ;;
    sanitize)
      export ASYNCTP_TIMEOUT_MS=300000  # a peer slowed down by the tools must not time out
      for tool in ${SANITIZE_TOOLS:-memcheck racecheck synccheck initcheck}; do
        calls=8
        algos=sequential,pipelined,fused
        [ $tool = racecheck ] && calls=2
        [ $tool = initcheck ] && algos=fused
        echo "== compute-sanitizer --tool $tool ($algos, $calls calls each, ${two_ranks[*]})"
        # memcheck: device memory errors only; NCCL's start-up probes for kernels of other GPUs fail
        # on purpose (cudaErrorNoKernelImageForDevice), which API-error reporting would count.
        extra=()
        [ $tool = memcheck ] && extra=(--report-api-errors no)
        timeout "${SANITIZE_TIMEOUT_S:-600}" compute-sanitizer --tool $tool --target-processes all --error-exitcode 9 \
          --print-limit 50 "${extra[@]}" "$build/tools/asynctp-soak" "${two_ranks[@]}" --algorithms $algos \
          --calls $calls --check-every 2 --max-dim 512 --max-growth-mib 100000 >"$out/sanitize_$tool.log" 2>&1
        rc=$?
        echo "exit $rc"
        [ $rc -eq 0 ] || status=1
        grep -E "ERROR SUMMARY|RACECHECK SUMMARY|wrong|failed" "$out/sanitize_$tool.log" | head -8
      done
      ;;
    python)
      echo "== Python package: pytest python/tests"
      PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH} ASYNCTP_LIBRARY=$(cd "$build" && pwd)/libasynctp_c.so \
        timeout "${PYTEST_TIMEOUT_S:-560}" python3 -m pytest -q -rs -p no:cacheprovider python/tests >"$out/pytest.log" 2>&1
      echo "exit $?"
      grep -E "^(FAILED|ERROR)|passed|failed" "$out/pytest.log" | tail -12
      grep -qE "^[0-9]+ passed" "$out/pytest.log" && ! grep -qE "[0-9]+ (failed|errors?)" "$out/pytest.log" || status=1
      ;;
    torch)
      export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH} ASYNCTP_LIBRARY=$(cd "$build" && pwd)/libasynctp_c.so
      for run in "$gpus examples/two_ways_in.py" "$gpus bench/binding_overhead.py" "1 bench/binding_overhead.py" \
                 "1 bench/binding_overhead.py python" "1 bench/binding_overhead.py" "1 bench/binding_overhead.py python" \
                 "$gpus bench/communicator_cost.py" "$gpus bench/compiled_tp.py" "1 examples/triton_all_gather_matmul.py" \
                 "$gpus examples/triton_all_gather_matmul.py"; do
        read -r ranks script registration <<<"$run"
        base=$(basename "$script" .py)_$ranks${registration:+_$registration}
        # A run repeated (one GPU: the world-size run is a one-rank run too) gets the next number.
        name=$base
        n=2
        while [ -f "$out/$name.txt" ]; do name=${base}_$n; n=$((n + 1)); done
        echo "== ${registration:+ASYNCTP_TORCH_EXTENSION=0 }torchrun --nproc-per-node $ranks $script"
        # "python": the torch ops registered in Python (the host cost's other side, alternating with C++).
        ASYNCTP_TORCH_EXTENSION=${registration:+0} timeout "${TORCH_TIMEOUT_S:-300}" \
          torchrun --nproc-per-node "$ranks" "$script" >"$out/$name.txt" 2>"$out/$name.err"
        rc=$?
        echo "exit $rc"
        [ $rc -eq 0 ] || { status=1; tail -5 "$out/$name.err"; }
        grep -v "^W[0-9]" "$out/$name.txt" | head -20
      done
      ;;
    bench)
      for kind in "bf16 --algorithms sequential,pipelined,fused,auto" \
                  "e4m3_tensor --dtype e4m3 --algorithms sequential,pipelined,auto" \
                  "e4m3_fast --dtype e4m3 --fast-accum --algorithms sequential,pipelined,fused,auto" \
                  "e4m3_row --dtype e4m3 --scales row --algorithms sequential,pipelined,auto"; do
        read -r name args <<<"$kind"
        echo "== asynctp-bench --shapes seeds --op both $args"
        # shellcheck disable=SC2086  # $args is a list of options
        "$build/tools/asynctp-bench" --shapes seeds --op both $args --json "$out/bench_$name.json" \
          >"$out/bench_$name.txt" 2>"$out/bench_$name.err" || status=1
        grep -E "^(all_gather|matmul_reduce)|^  [a-z]" "$out/bench_$name.txt" | head -60
      done
      echo "== bench/torch_anchor.py on $gpus GPU(s) (same call)"
      PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH} timeout "${TORCH_TIMEOUT_S:-300}" \
        torchrun --nproc-per-node "$gpus" bench/torch_anchor.py >"$out/torch_anchor.txt" 2>"$out/torch_anchor.err" \
        || status=1
      grep -v "^W" "$out/torch_anchor.txt" | head -40
      ;;
    ab)
      base=${1:?ab needs the base build folder}
      times=${2:?ab needs a count}
      shift 2
      echo "== asynctp-bench --gpus 1 --shapes seeds, $base and $build in turn, $times times each"
      for i in $(seq "$times"); do
        for b in "$base" "$build"; do
          name=$(basename "$b")
          "$b/tools/asynctp-bench" --gpus 1 --shapes seeds --op both --algorithms sequential,fused \
            --json "$out/ab_${name}_$i.json" >"$out/ab_${name}_$i.txt" 2>&1 || status=1
        done
      done
      python3 - "$out" "$base" "$build" "$times" <<'EOF'
import json, os, sys, statistics
out, base, new, times = sys.argv[1], os.path.basename(sys.argv[2]), os.path.basename(sys.argv[3]), int(sys.argv[4])
rows = {}
for b in (base, new):
    for i in range(1, times + 1):
        path = os.path.join(out, f"ab_{b}_{i}.json")
        if not os.path.exists(path):
            continue
        for line in open(path):
            j = json.loads(line)
            if j.get("algorithm") != "fused" or "fused_gemm_alone_us" not in j:
                continue
            key = (j["op"], f'{j["M"]}x{j["N"]}x{j["K"]}')
            rows.setdefault(key, {}).setdefault(b, []).append(j["gemm_alone_us"] / j["fused_gemm_alone_us"])
print(f"{'op':5} {'shape':18} {'cuBLAS/fused ' + base:>26} {'cuBLAS/fused ' + new:>26} {'new/base':>9}")
for (op, shape), r in sorted(rows.items()):
    a, b = r.get(base, []), r.get(new, [])
    fa = " ".join(f"{x:.3f}" for x in a)
    fb = " ".join(f"{x:.3f}" for x in b)
    ratio = statistics.median(b) / statistics.median(a) if a and b else float("nan")
    print(f"{op:5} {shape:18} {fa:>26} {fb:>26} {ratio:9.3f}")
EOF
      ;;
    *)
      echo "unknown stage '$stage'" >&2
      exit 2
      ;;
  esac
done
exit $status
