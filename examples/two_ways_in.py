"""A Llama-style MLP written for PyTorch's tensor parallelism, run with asynctp's fused ops in the two
ways that need no change to the model, each checked against the same model on one GPU.

    torchrun --nproc-per-node 2 examples/two_ways_in.py [--way compile|dtensor|both]

- compile: the model is written with PyTorch's functional collectives (sequence-parallel: the input's
  rows are sharded) and compiled by inductor with asynctp.inductor.enable_async_tp on: inductor's
  micro-pipeline TP pass finds the all-gather + matmuls and matmul + reduce-scatter, and asynctp's pass
  puts asynctp's ops in their place.
- dtensor: a plain nn.Module parallelized with DTensor's parallelize_module, using asynctp.parallel's
  ColwiseParallel and RowwiseParallel instead of torch's; eager, no torch.compile.
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard
from torch.distributed.tensor.parallel import parallelize_module

import asynctp
import asynctp.inductor
import asynctp.parallel


class Mlp(nn.Module):
    def __init__(self, hidden, ffn):
        super().__init__()
        self.w1 = nn.Linear(hidden, ffn, bias=False)
        self.w3 = nn.Linear(hidden, ffn, bias=False)
        self.w2 = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x):
        return self.w2(nn.functional.silu(self.w1(x)) * self.w3(x))


def compiled_way(whole, x_rows, rank, world, group):
    """Each rank holds its shard of the weights and its rows of x; the program gathers and scatters."""
    w1 = whole.w1.weight.chunk(world, 0)[rank]
    w3 = whole.w3.weight.chunk(world, 0)[rank]
    w2 = whole.w2.weight.chunk(world, 1)[rank]

    def block(x):
        a = funcol.all_gather_tensor(x, 0, group)
        h = nn.functional.silu(a @ w1.t()) * (a @ w3.t())
        return funcol.reduce_scatter_tensor(h @ w2.t(), "sum", 0, group)

    asynctp.inductor.enable_async_tp(group)
    return torch.compile(block)(x_rows)


def dtensor_way(whole, x_rows, mesh):
    model = Mlp(whole.w1.in_features, whole.w1.out_features).to(x_rows.device, x_rows.dtype)
    model.load_state_dict(whole.state_dict())
    parallelize_module(model, mesh, {
        "w1": asynctp.parallel.ColwiseParallel(input_layouts=Shard(0)),
        "w3": asynctp.parallel.ColwiseParallel(input_layouts=Shard(0)),
        "w2": asynctp.parallel.RowwiseParallel(output_layouts=Shard(0)),
    })
    return model(x_rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--way", choices=["compile", "dtensor", "both"], default="both")
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--ffn", type=int, default=5632)
    args = parser.parse_args()
    rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    world = dist.get_world_size()
    mesh = init_device_mesh("cuda", (world,))
    group = mesh.get_group().group_name

    torch.manual_seed(0)  # the same whole model and input on every rank
    whole = Mlp(args.hidden, args.ffn).to(device, torch.bfloat16)
    for p in whole.parameters():
        nn.init.normal_(p, std=args.hidden ** -0.5)
    x = torch.randn(args.tokens, args.hidden, device=device, dtype=torch.bfloat16)
    rows = slice(rank * args.tokens // world, (rank + 1) * args.tokens // world)
    with torch.no_grad():
        expected = whole(x)[rows].float()
        for way in (["compile", "dtensor"] if args.way == "both" else [args.way]):
            got = compiled_way(whole, x[rows], rank, world, group) if way == "compile" else dtensor_way(whole, x[rows], mesh)
            err = (got.float() - expected).abs().max().item() / expected.abs().max().item()
            print(f"rank {rank}: {way}: max error {err:.2e} of the largest value (bf16)", flush=True)
            assert err < 2e-2, f"{way}: the result differs from one GPU's"
    asynctp.shutdown()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
