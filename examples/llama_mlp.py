"""A Llama-style MLP block, tensor-parallel with asynctp, checked against the same block on one GPU.

    torchrun --nproc-per-node 2 examples/llama_mlp.py [--tokens 4096 --hidden 4096 --ffn 14336]

Sequence parallelism: each rank holds tokens/world rows of the input. The column-parallel gate and up
projections share one gather (one all_gather_matmul with two Bs); the row-parallel down projection
ends in a reduce-scatter (matmul_reduce_scatter), which leaves each rank its rows of the output.
Forward and backward both run through asynctp: the backward of each op is the other op.
"""

import argparse
import math
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F

import asynctp


class TensorParallelMLP(torch.nn.Module):
    """down(silu(gate(x)) * up(x)) with gate and up split by output features, down by input features."""

    def __init__(self, w_gate, w_up, w_down, group=None, algorithm="auto"):
        super().__init__()
        self.w_gate = torch.nn.Parameter(w_gate)  # [ffn / world, hidden]
        self.w_up = torch.nn.Parameter(w_up)  # [ffn / world, hidden]
        self.w_down = torch.nn.Parameter(w_down)  # [hidden, ffn / world]
        self.group, self.algorithm = group, algorithm

    @classmethod
    def shard_of(cls, w_gate, w_up, w_down, rank, world, **kwargs):
        """This rank's part of the whole block's weights (nn.Linear layout, [out, in])."""
        return cls(w_gate.chunk(world, 0)[rank].contiguous(), w_up.chunk(world, 0)[rank].contiguous(),
                   w_down.chunk(world, 1)[rank].contiguous(), **kwargs)

    def forward(self, x_shard):  # [tokens / world, hidden] -> [tokens / world, hidden]
        _, (gate, up) = asynctp.all_gather_matmul(x_shard, [self.w_gate.t(), self.w_up.t()], 0, self.group,
                                                  return_a=False, algorithm=self.algorithm)
        return asynctp.matmul_reduce_scatter(F.silu(gate) * up, self.w_down.t(), "sum", 0, self.group,
                                             algorithm=self.algorithm)


def reference_mlp(x, w_gate, w_up, w_down):
    return (F.silu(x @ w_gate.t()) * (x @ w_up.t())) @ w_down.t()


def _rel_err(got, ref):
    return ((got.float() - ref).abs().max() / ref.abs().max()).item()


def check(rank, world, tokens=1024, hidden=1024, ffn=2816, dtype=torch.bfloat16, algorithm="auto"):
    """Runs the block forward and backward on this rank and on the whole inputs in fp32; returns the
    largest error of each result relative to the reference's largest value."""
    dev = torch.device("cuda", torch.cuda.current_device())
    g = torch.Generator().manual_seed(0)

    # Every rank draws the whole inputs from one seed, rounded to `dtype` so that both sides see the same.
    def draw(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(dtype).float().to(dev)

    x = draw(tokens, hidden)
    w_gate, w_up = draw(ffn, hidden, scale=hidden ** -0.5), draw(ffn, hidden, scale=hidden ** -0.5)
    w_down = draw(hidden, ffn, scale=ffn ** -0.5)
    grad_y = draw(tokens, hidden)

    ref = [t.clone().requires_grad_() for t in (x, w_gate, w_up, w_down)]
    y_ref = reference_mlp(*ref)
    (y_ref * grad_y).sum().backward()

    mlp = TensorParallelMLP.shard_of(w_gate.to(dtype), w_up.to(dtype), w_down.to(dtype), rank, world,
                                     algorithm=algorithm)
    x_shard = x.chunk(world)[rank].to(dtype).requires_grad_()
    y = mlp(x_shard)
    (y.float() * grad_y.chunk(world)[rank]).sum().backward()

    return {
        "y": _rel_err(y, y_ref.chunk(world)[rank]),
        "dx": _rel_err(x_shard.grad, ref[0].grad.chunk(world)[rank]),
        "dw_gate": _rel_err(mlp.w_gate.grad, ref[1].grad.chunk(world, 0)[rank]),
        "dw_up": _rel_err(mlp.w_up.grad, ref[2].grad.chunk(world, 0)[rank]),
        "dw_down": _rel_err(mlp.w_down.grad, ref[3].grad.chunk(world, 1)[rank]),
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--ffn", type=int, default=14336)
    p.add_argument("--algorithm", default="auto", choices=["auto", "sequential", "pipelined", "fused"])
    args = p.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    errors = check(rank, world, args.tokens, args.hidden, args.ffn, algorithm=args.algorithm)
    worst = max(errors.values())
    if rank == 0:
        print(f"llama_mlp: {world} ranks, tokens {args.tokens}, hidden {args.hidden}, ffn {args.ffn}, bf16, "
              f"{args.algorithm}; error relative to the fp32 reference's largest value: "
              + ", ".join(f"{k} {v:.2e}" for k, v in errors.items()))
    ok = worst < 2e-2 and math.isfinite(worst)
    asynctp.shutdown()
    dist.destroy_process_group()
    if not ok:
        raise SystemExit(f"rank {rank}: llama_mlp: error {worst:.3g} against the reference exceeds 2e-2")


if __name__ == "__main__":
    main()
