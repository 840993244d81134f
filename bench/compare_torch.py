"""asynctp's torch ops beside PyTorch's own paths, in one torchrun, on the same tensors:
NCCL + cuBLAS, torch.ops.symm_mem's fused ops, and asynctp with each algorithm, at the seed shapes and on
a Llama-style MLP block. Every result is checked against NCCL + cuBLAS before it is timed.

    torchrun --nproc-per-node 2 bench/compare_torch.py [--iters 30] [--json results.json]

Two timings, in microseconds, each the slowest rank's: back to back (the mean of --iters calls in a
row, the host running ahead as in a training step) and alone (the median of --iters calls, each
started after a barrier on idle GPUs, as bench/torch_anchor.py and asynctp-bench time; the host's
time to launch the call is then on the clock).
"""

import argparse
import json
import os
import statistics

import torch
import torch.distributed as dist
import torch.distributed._symmetric_memory as symm_mem
import torch.nn.functional as F

import asynctp

SEED_SHAPES = [(4096, 3584, 8192), (2048, 3584, 8192), (4096, 6656, 16384), (16384, 8192, 8192)]
ALGORITHMS = ["sequential", "pipelined", "fused", "auto"]


def gpu_us(fn):
    """One call of fn, event-timed on the current stream."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000.0


def median_after_barrier(fn, clock, iters, warmup=5):
    """This rank's median of clock(fn) over `iters` calls, each started after a barrier on idle GPUs."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        dist.barrier()
        torch.cuda.synchronize()
        times.append(clock(fn))
    return statistics.median(times)


def timed(fn, iters):
    """{"idle": median of single calls each started on idle GPUs after a barrier (the host's time to
    launch is on the clock), "steady": mean of `iters` calls back to back (the host runs ahead, as in
    a training step)}, each the slowest rank's."""
    idle = median_after_barrier(fn, gpu_us, iters)

    def back_to_back():
        for _ in range(iters):
            fn()

    dist.barrier()
    torch.cuda.synchronize()
    t = torch.tensor([idle, gpu_us(back_to_back) / iters], device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return {"idle": t[0].item(), "steady": t[1].item()}


def checked(name, got, ref):
    """Max error relative to the reference's largest value, across ranks; a wrong result stops the run."""
    err = torch.tensor([((got.float() - ref.float()).abs().max() / ref.float().abs().max()).item()], device="cuda")
    dist.all_reduce(err, op=dist.ReduceOp.MAX)
    if not err.item() <= 2e-2:
        raise SystemExit(f"compare_torch: {name} differs from NCCL+cuBLAS by {err.item():.3g} (relative to its max)")
    return err.item()


def all_gather_rows(M, N, K, world, gname, iters):
    a_shard = torch.randn(M // world, K, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16) * K ** -0.5
    a_full = torch.empty(M, K, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)

    def nccl_cublas():
        dist.all_gather_into_tensor(a_full, a_shard)
        torch.mm(a_full, b, out=c)

    nccl_cublas()
    ref = c.clone()
    row = {"op": "all_gather_matmul", "shape": f"{M}x{N}x{K}",
           "gemm alone": timed(lambda: torch.mm(a_full, b, out=c), iters),
           "NCCL+cuBLAS": timed(nccl_cublas, iters)}
    checked("torch fused", torch.ops.symm_mem.fused_all_gather_matmul(a_shard, [b], 0, gname)[1][0], ref)
    row["torch fused"] = timed(lambda: torch.ops.symm_mem.fused_all_gather_matmul(a_shard, [b], 0, gname), iters)
    for alg in ALGORITHMS:
        def run(alg=alg):
            return asynctp.all_gather_matmul(a_shard, [b], 0, gname, return_a=False, algorithm=alg)[1][0]
        checked(f"asynctp {alg}", run(), ref)
        row[f"asynctp {alg}"] = timed(run, iters)
    return row


def reduce_scatter_rows(M, N, K, world, gname, iters):
    a = torch.randn(M, K // world, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(K // world, N, device="cuda", dtype=torch.bfloat16) * K ** -0.5
    p = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(M // world, N, device="cuda", dtype=torch.bfloat16)

    def nccl_cublas():
        torch.mm(a, b, out=p)
        dist.reduce_scatter_tensor(out, p)

    nccl_cublas()
    ref = out.clone()
    row = {"op": "matmul_reduce_scatter", "shape": f"{M}x{N}x{K}",
           "gemm alone": timed(lambda: torch.mm(a, b, out=p), iters),
           "NCCL+cuBLAS": timed(nccl_cublas, iters)}
    checked("torch fused", torch.ops.symm_mem.fused_matmul_reduce_scatter(a, b, "sum", 0, gname), ref)
    row["torch fused"] = timed(lambda: torch.ops.symm_mem.fused_matmul_reduce_scatter(a, b, "sum", 0, gname), iters)
    for alg in ALGORITHMS:
        def run(alg=alg):
            return asynctp.matmul_reduce_scatter(a, b, "sum", 0, gname, algorithm=alg)
        checked(f"asynctp {alg}", run(), ref)
        row[f"asynctp {alg}"] = timed(run, iters)
    return row


def mlp_rows(tokens, hidden, ffn, world, gname, iters):
    """Forward of a Llama MLP block (examples/llama_mlp.py): x_shard -> gate, up -> silu(gate) * up -> down."""
    x_shard = torch.randn(tokens // world, hidden, device="cuda", dtype=torch.bfloat16)
    w_gate = torch.randn(ffn // world, hidden, device="cuda", dtype=torch.bfloat16) * hidden ** -0.5
    w_up = torch.randn(ffn // world, hidden, device="cuda", dtype=torch.bfloat16) * hidden ** -0.5
    w_down = torch.randn(hidden, ffn // world, device="cuda", dtype=torch.bfloat16) * ffn ** -0.5
    x_full = torch.empty(tokens, hidden, device="cuda", dtype=torch.bfloat16)
    y_shard = torch.empty(tokens // world, hidden, device="cuda", dtype=torch.bfloat16)

    def nccl_cublas():
        dist.all_gather_into_tensor(x_full, x_shard)
        h = F.silu(x_full @ w_gate.t()) * (x_full @ w_up.t())
        dist.reduce_scatter_tensor(y_shard, h @ w_down.t())
        return y_shard

    def gemms_alone():
        return (F.silu(x_full @ w_gate.t()) * (x_full @ w_up.t())) @ w_down.t()

    def torch_fused():
        _, (gate, up) = torch.ops.symm_mem.fused_all_gather_matmul(x_shard, [w_gate.t(), w_up.t()], 0, gname,
                                                                   return_A=False)
        return torch.ops.symm_mem.fused_matmul_reduce_scatter(F.silu(gate) * up, w_down.t(), "sum", 0, gname)

    def with_asynctp(alg):
        _, (gate, up) = asynctp.all_gather_matmul(x_shard, [w_gate.t(), w_up.t()], 0, gname, return_a=False,
                                                  algorithm=alg)
        return asynctp.matmul_reduce_scatter(F.silu(gate) * up, w_down.t(), "sum", 0, gname, algorithm=alg)

    ref = nccl_cublas().clone()
    row = {"op": "llama_mlp forward", "shape": f"T{tokens} H{hidden} F{ffn}",
           "gemm alone": timed(gemms_alone, iters), "NCCL+cuBLAS": timed(nccl_cublas, iters)}
    checked("torch fused MLP", torch_fused(), ref)
    row["torch fused"] = timed(torch_fused, iters)
    for alg in ALGORITHMS:
        checked(f"asynctp {alg} MLP", with_asynctp(alg), ref)
        row[f"asynctp {alg}"] = timed(lambda alg=alg: with_asynctp(alg), iters)
    return row


def print_table(rows, world, timing, title):
    cols = ["gemm alone", "NCCL+cuBLAS", "torch fused"] + [f"asynctp {a}" for a in ALGORITHMS]
    print(f"\n{world} ranks, bf16, µs (slowest rank), {title}; 'best' is asynctp's fastest algorithm")
    print("| op | shape | " + " | ".join(cols) + " | best vs NCCL+cuBLAS | best vs torch fused |")
    print("|---|---|" + "---:|" * (len(cols) + 2))
    for r in rows:
        t = {c: r[c][timing] for c in cols}
        best = min(t[f"asynctp {a}"] for a in ALGORITHMS)
        print(f"| {r['op']} | {r['shape']} | " + " | ".join(f"{t[c]:.1f}" for c in cols)
              + f" | {t['NCCL+cuBLAS'] / best:.2f}x | {t['torch fused'] / best:.2f}x |")


def main():
    p = argparse.ArgumentParser(description="asynctp beside PyTorch's fused ops and NCCL+cuBLAS (run with torchrun)")
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--json", help="also write the rows to this file (rank 0)")
    p.add_argument("--mlp", default="8192,4096,14336", help="tokens,hidden,ffn of the MLP block (Llama 3 8B)")
    args = p.parse_args()
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    rank, world = dist.get_rank(), dist.get_world_size()
    gname = dist.group.WORLD.group_name
    symm_mem.enable_symm_mem_for_group(gname)
    torch.manual_seed(rank)

    rows = []
    for M, N, K in SEED_SHAPES:
        rows.append(all_gather_rows(M, N, K, world, gname, args.iters))
        rows.append(reduce_scatter_rows(M, N, K, world, gname, args.iters))
        if rank == 0:
            print(json.dumps(rows[-2]), json.dumps(rows[-1]), sep="\n", flush=True)
    tokens, hidden, ffn = (int(v) for v in args.mlp.split(","))
    rows.append(mlp_rows(tokens, hidden, ffn, world, gname, args.iters))
    if rank == 0:
        print(json.dumps(rows[-1]), flush=True)
        print_table(rows, world, "steady", f"back to back (mean of {args.iters} calls in a row)")
        print_table(rows, world, "idle", f"each call alone on idle GPUs (median of {args.iters})")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"world_size": world, "gpu": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)
    asynctp.shutdown()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
