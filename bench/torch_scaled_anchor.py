"""PyTorch's own fp8 paths, timed for reference beside asynctp-bench --dtype e4m3 --fast-accum (run in
the same call): torch._scaled_mm alone on the gathered A, and torch.ops.symm_mem.fused_all_gather_scaled_matmul,
at the seed shapes, 8192x8192x8192 and 16384x4096x14336 (MxNxK, A gathered along M). e4m3 A and B (B
an nn.Linear-style [N, K] weight), tensor-wise fp32 scales, bf16 output, use_fast_accum. GPU µs: the
median of 30 event-timed calls, each started on idle GPUs after a barrier.

    PYTHONPATH=python torchrun --nproc-per-node 1 bench/torch_scaled_anchor.py

(compare_torch.py, whose timing helpers it uses, imports the asynctp package: PYTHONPATH=python, or the
package installed.)
"""

import os

import torch
import torch.distributed as dist
import torch.distributed._symmetric_memory  # noqa: F401 (symm_mem's ops in Python)

from compare_torch import gpu_us, median_after_barrier  # bench/ is the script's folder

SHAPES = [(4096, 3584, 8192), (2048, 3584, 8192), (4096, 6656, 16384), (16384, 8192, 8192), (8192, 8192, 8192),
          (16384, 4096, 14336)]


def main():
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    world, name = dist.get_world_size(), dist.group.WORLD.group_name
    one = torch.ones((), device="cuda")
    rows = []
    for m, n, k in SHAPES:
        a_shard = torch.randn(m // world, k, device="cuda").to(torch.float8_e4m3fn)
        a_full = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
        w = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn)
        gemm = lambda: torch._scaled_mm(a_full, w.t(), one, one, out_dtype=torch.bfloat16,  # noqa: E731
                                        use_fast_accum=True)
        fused = lambda: torch.ops.symm_mem.fused_all_gather_scaled_matmul(  # noqa: E731
            a_shard, [w.t()], one, [one], 0, name, [None], [None], [torch.bfloat16], [True])
        gemm_us = median_after_barrier(gemm, gpu_us, 30, warmup=8)
        try:
            fused_us = f"{median_after_barrier(fused, gpu_us, 30, warmup=8):.1f}"
        except Exception as e:  # the row still shows the GEMM alone, and why the fused op is missing
            fused_us = f"{type(e).__name__}: {e}"
        rows.append((m, n, k, gemm_us, fused_us))
    if dist.get_rank() == 0:
        print(f"{world} ranks, {torch.cuda.get_device_name()}, PyTorch {torch.__version__}, e4m3 tensor-wise, "
              "fast accumulation, bf16 out, GPU µs (median of 30, rank 0)")
        print("| M×N×K | torch._scaled_mm alone | symm_mem.fused_all_gather_scaled_matmul |\n|---|---:|---:|")
        for m, n, k, gemm_us, fused_us in rows:
            print(f"| {m}×{n}×{k} | {gemm_us:.1f} | {fused_us} |")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
