"""A tensor-parallel MLP block compiled three ways, timed side by side in one torchrun: inductor alone
(NCCL all-gather and reduce-scatter around cuBLAS GEMMs), PyTorch's own async TP (inductor's
micro-pipeline TP pass: torch.ops.symm_mem's fused ops), and asynctp's (asynctp.inductor.enable_async_tp:
the same pass, then asynctp's ops in their place), each with and without the backward pass. Every
result, gradients included, is checked against inductor alone before it is timed.

    torchrun --nproc-per-node N bench/compiled_tp.py [--tokens 8192] [--hidden 4096] [--ffn 14336]
                                                     [--iters 30] [--algorithm auto]

The block is sequence-parallel (the input's rows sharded), written with PyTorch's functional
collectives: all-gather, silu(x W1) * (x W3), W2, reduce-scatter; bf16, Llama 3 8B's sizes by default.
Times are microseconds, the slowest rank's median of --iters calls, each started after a barrier on
idle GPUs (the host's launch time on the clock).
"""

import argparse
import os
import statistics

import torch
import torch._dynamo
import torch._inductor.config as inductor_config
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.distributed._symmetric_memory import enable_symm_mem_for_group

import asynctp
import asynctp.inductor


def block(x, w1, w3, w2, group):
    # The autograd-aware collectives: the backward's reduce-scatter and all-gather go through the pass too.
    a = funcol.all_gather_tensor_autograd(x, 0, group)
    h = torch.nn.functional.silu(a @ w1.t()) * (a @ w3.t())
    return funcol.reduce_scatter_tensor_autograd(h @ w2.t(), "sum", 0, group)


def compiled(way, group, algorithm):
    """A fresh compile of `block` with `way`'s passes on."""
    torch._dynamo.reset()
    asynctp.inductor.disable_async_tp()
    inductor_config._micro_pipeline_tp = False
    if way == "pytorch async TP":
        enable_symm_mem_for_group(group.group_name)
        inductor_config._micro_pipeline_tp = True
    elif way == "asynctp":
        asynctp.inductor.enable_async_tp(group, algorithm=algorithm)
    return torch.compile(block)


def step(fn, x, ws, group, backward):
    """One forward (and backward, where asked) through `fn`: the output and the gradients."""
    if not backward:
        return fn(x, *ws, group), []
    xs = x.detach().requires_grad_()
    params = [w.detach().requires_grad_() for w in ws]
    out = fn(xs, *params, group)
    out.float().square().mean().backward()
    return out.detach(), [xs.grad, *(p.grad for p in params)]


def median_us(run, iters):
    """The slowest rank's median over `iters` calls, each after a barrier on idle GPUs."""
    for _ in range(5):
        run()
    times = []
    for _ in range(iters):
        dist.barrier()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0)
    mine = torch.tensor([statistics.median(times)], device="cuda")
    dist.all_reduce(mine, dist.ReduceOp.MAX)
    return mine.item()


def max_rel_error(got, want):
    return ((got.float() - want.float()).abs().max() / want.float().abs().max().clamp_min(1e-6)).item()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--ffn", type=int, default=14336)
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--algorithm", default="auto", choices=["auto", "sequential", "pipelined", "fused"])
    args = p.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    group = dist.group.WORLD
    if args.tokens % world or args.ffn % world:
        raise SystemExit(f"--tokens {args.tokens} and --ffn {args.ffn} must divide by the world size {world}")
    g = torch.Generator().manual_seed(0)
    scale = args.hidden ** -0.5
    w1 = (torch.randn(args.ffn, args.hidden, generator=g) * scale).chunk(world, 0)[rank]
    w3 = (torch.randn(args.ffn, args.hidden, generator=g) * scale).chunk(world, 0)[rank]
    w2 = (torch.randn(args.hidden, args.ffn, generator=g) * args.ffn ** -0.5).chunk(world, 1)[rank]
    ws = [w.to(device, torch.bfloat16).contiguous() for w in (w1, w3, w2)]
    x = torch.randn(args.tokens, args.hidden, generator=g).chunk(world, 0)[rank].to(device, torch.bfloat16)

    ways = ["inductor alone", "pytorch async TP", "asynctp"]
    rows = []
    for backward in (False, True):
        reference = None
        for way in ways:
            fn = compiled(way, group, args.algorithm)
            out, grads = step(fn, x, ws, group, backward)
            if reference is None:
                reference = (out, grads)
                err = 0.0
            else:
                err = max([max_rel_error(out, reference[0])] +
                          [max_rel_error(a, b) for a, b in zip(grads, reference[1])])
                if err > 5e-2:
                    raise SystemExit(f"rank {rank}: {way} differs from inductor alone by {err:.3g} of the "
                                     f"largest value ({'forward and backward' if backward else 'forward'})")
            us = median_us(lambda fn=fn: step(fn, x, ws, group, backward), args.iters)
            rows.append((way, "forward and backward" if backward else "forward", us, err))
    asynctp.inductor.disable_async_tp()
    if rank == 0:
        print(f"{world} ranks, {torch.cuda.get_device_name()}, TP MLP block T{args.tokens} H{args.hidden} "
              f"F{args.ffn} bf16, asynctp algorithm {args.algorithm}; slowest rank's median of {args.iters}, µs")
        print("| compiled with | pass | µs | vs inductor alone | max error |")
        print("|---|---|---:|---:|---:|")
        base = {r[1]: r[2] for r in rows if r[0] == "inductor alone"}
        for way, what, us, err in rows:
            print(f"| {way} | {what} | {us:.1f} | {base[what] / us:.2f}x | {err:.1e} |")
    asynctp.shutdown()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
