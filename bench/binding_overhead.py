"""Where the Python binding's time goes, per call of all_gather_matmul (4096x3584x8192, bf16): the C
interface called directly with prepared arguments (as is, without the ranks' check of each other's
arguments, and without the pointer lookups, as the torch ops call it), the public function, and
torch.ops.asynctp; beside them PyTorch's own torch.ops.symm_mem.fused_all_gather_matmul. The torch ops
are those registered in C++ by libasynctp_torch.so where it is there, else in Python;
ASYNCTP_TORCH_EXTENSION=0 picks Python (the table's title says which ran). Host: wall time of a call
alone, after a barrier, and per call of calls in a row; GPU: event-timed call started on idle GPUs
after a barrier, as bench/compare_torch.py times. At one rank the host time has no wait for a peer in
it.

    torchrun --nproc-per-node 2 bench/binding_overhead.py
    torchrun --nproc-per-node 1 bench/binding_overhead.py
    ASYNCTP_TORCH_EXTENSION=0 torchrun --nproc-per-node 1 bench/binding_overhead.py
"""

import ctypes
import os
import random
import statistics
import time

import torch
import torch.distributed as dist
import torch.distributed._symmetric_memory as symm_mem

import asynctp
from asynctp import _calls, _lib, ops
from asynctp.comm import communicator
from compare_torch import gpu_us, median_after_barrier  # bench/ is the script's folder


# Host time moves by tens of µs with what else the host runs. The paths are timed in turn, a call of
# each per round, so that they see the same host; the table gives each one's median and tenth percentile.
# Each round takes them in an order of its own (the same on every rank): a call right after one of the
# same code finds the host's caches warmer than one after another path, and a fixed order would hand
# that to the same paths every round.
HOST_ROUNDS = 200


# A call alone finds a host that has just waited for the GPU: its cores may have slowed or slept, and
# that wake-up moves the figure by tens of µs between runs of one build. Calls in a row, the host running
# ahead of the GPU as it does through a model's layers, show the library's and the binding's own cost.
IN_A_ROW, ROW_ROUNDS = 50, 20


def host_us(fn):
    t = time.perf_counter()
    fn()
    us = (time.perf_counter() - t) * 1e6
    torch.cuda.synchronize()
    return us


def in_a_row_us(fn):
    """Host time per call of IN_A_ROW calls one after another (the GPU queue holds them all)."""
    t = time.perf_counter()
    for _ in range(IN_A_ROW):
        fn()
    us = (time.perf_counter() - t) * 1e6 / IN_A_ROW
    torch.cuda.synchronize()
    return us


def in_turn(paths, rounds, timer, shuffled):
    """timer(call) of every path, `rounds` times: each round takes the paths in an order of its own,
    each after a barrier on idle GPUs."""
    times, order = {key: [] for key in paths}, list(paths)
    for _ in range(rounds):
        shuffled.shuffle(order)
        for key in order:
            dist.barrier()
            torch.cuda.synchronize()
            times[key].append(timer(paths[key]))
    return times


def main():
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    world, name = dist.get_world_size(), dist.group.WORLD.group_name
    M, N, K = 4096, 3584, 8192
    a = torch.randn(M // world, K, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    comm = communicator(name)
    a_ref, b_refs, out_refs = _calls._ref(a, "", "a"), (_lib.Tensor * 1)(_calls._ref(b, "", "b")), (_lib.Tensor * 1)(_calls._ref(out, "", "out"))
    def calls(alg):  # a function of its own, so that each algorithm's calls keep their own options
        opt = _lib.options(_lib.ALGORITHMS[alg], _lib.ROW_MAJOR, 0)
        unchecked = _lib.options(_lib.ALGORITHMS[alg], _lib.ROW_MAJOR, 0, check_across_ranks=False)
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        c_call = lambda o: lambda: _lib.call("all_gather_matmul", comm.handle, ctypes.byref(a_ref),  # noqa: E731
                                             b_refs, 1, 0, out_refs, None, stream, ctypes.byref(o))
        rows = {
            (alg, "C interface"): c_call(opt),
            (alg, "C interface, check_across_ranks=0"): c_call(unchecked),
        }
        if "check_pointers" in dict(_lib.OpOptions._fields_):  # as the torch ops call it (C API version 7 on)
            rows[(alg, "C interface, check_pointers=0")] = c_call(
                _lib.options(_lib.ALGORITHMS[alg], _lib.ROW_MAJOR, 0, check_pointers=False))
        return {
            **rows,
            (alg, "asynctp.all_gather_matmul"): lambda: asynctp.all_gather_matmul(a, [b], 0, name, return_a=False,
                                                                                  algorithm=alg),
            (alg, "torch.ops.asynctp.all_gather_matmul"): lambda: torch.ops.asynctp.all_gather_matmul(
                a, [b], 0, name, False, alg, 0),
        }

    paths = {**calls("sequential"), **calls("fused")}  # (algorithm, called through) -> the call
    missing = []
    try:
        symm_mem.enable_symm_mem_for_group(name)
        torch_fused = lambda: torch.ops.symm_mem.fused_all_gather_matmul(a, [b], 0, name)  # noqa: E731
        torch_fused()
        paths[("PyTorch's fused", "torch.ops.symm_mem.fused_all_gather_matmul")] = torch_fused
    except Exception as e:  # the table still shows asynctp's rows, and why PyTorch's is missing
        missing.append(("PyTorch's fused", f"torch.ops.symm_mem.fused_all_gather_matmul: {type(e).__name__}: {e}"))
    for fn in paths.values():
        for _ in range(3):
            fn()
    shuffled = random.Random(0)  # the same orders on every rank
    host = in_turn(paths, HOST_ROUNDS, host_us, shuffled)
    row = in_turn(paths, ROW_ROUNDS, in_a_row_us, shuffled)
    rows = [(alg, path, statistics.median(host[(alg, path)]), statistics.quantiles(host[(alg, path)], n=10)[0],
             statistics.median(row[(alg, path)]), median_after_barrier(fn, gpu_us, 20, warmup=3))
            for (alg, path), fn in paths.items()]
    rows += [(alg, path, float("nan"), float("nan"), float("nan"), float("nan")) for alg, path in missing]
    if dist.get_rank() == 0:
        registered = "C++ (libasynctp_torch.so)" if ops.EXTENSION else "Python"
        print(f"{world} ranks, {torch.cuda.get_device_name()}, all_gather_matmul {M}x{N}x{K} bf16, torch ops "
              f"registered in {registered}, rank 0. Host µs per call: a call alone ({HOST_ROUNDS} of each, the paths "
              f"in turn, shuffled), and {IN_A_ROW} calls in a row (median of {ROW_ROUNDS}); GPU µs: median of 20")
        print("| algorithm | called through | host µs, alone, median | alone, p10 | in a row, median | GPU µs, median |\n"
              "|---|---|---:|---:|---:|---:|")
        for alg, path, median, p10, in_row, gpu in rows:
            print(f"| {alg} | {path} | {median:.1f} | {p10:.1f} | {in_row:.1f} | {gpu:.1f} |")
    asynctp.shutdown()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
