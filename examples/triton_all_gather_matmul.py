"""An all-gather + matmul of one's own, in Triton, on asynctp.symmetric: each rank pushes its shard of
A into every rank's symmetric buffer chunk by chunk (plain tensor copies: the copy engine) and flags
each chunk; one Triton matmul over the gathered A waits, tile by tile, for the flags of the chunks its
rows come from, so it starts on the rows that are in while the rest arrive. Checked against torch's
matmul of the whole A, and timed beside asynctp.all_gather_matmul(algorithm="fused").

    torchrun --nproc-per-node N examples/triton_all_gather_matmul.py [M N K] [chunks per rank]

M is the gathered rows (a multiple of 128 * N * chunks). Flags: rank r's chunk c of call e raises flag
r * chunks + c of every rank's pad to e (epochs: no flag is ever reset).
"""

import os
import sys

import torch
import torch.distributed as dist
import triton
import triton.language as tl

import asynctp

BLOCK_M, BLOCK_N, BLOCK_K = 128, 128, 64
MAX_SPINS = 1 << 30  # a bound on each wait: a flag that never comes ends the kernel with a wrong flag


@triton.jit
def _wait_flag(flag_ptr, value, error_ptr, max_spins):
    seen = tl.atomic_add(flag_ptr, 0, sem="acquire", scope="sys")
    spins = 0
    while (seen < value) & (spins < max_spins):
        seen = tl.atomic_add(flag_ptr, 0, sem="acquire", scope="sys")
        spins += 1
    if seen < value:
        tl.atomic_max(error_ptr, 1)


@triton.jit
def _gathered_matmul(a_ptr, b_ptr, c_ptr, flags_ptr, error_ptr, M, N, K, rows_per_rank, rows_per_chunk, chunks,
                     epoch, max_spins, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    tiles_n = tl.cdiv(N, BLOCK_N)
    pid_m, pid_n = pid // tiles_n, pid % tiles_n
    # The chunks this tile's rows come from (a chunk holds at least BLOCK_M rows: at most two).
    first = pid_m * BLOCK_M
    last = tl.minimum(first + BLOCK_M, M) - 1
    _wait_flag(flags_ptr + (first // rows_per_rank) * chunks + (first % rows_per_rank) // rows_per_chunk, epoch,
               error_ptr, max_spins)
    _wait_flag(flags_ptr + (last // rows_per_rank) * chunks + (last % rows_per_rank) // rows_per_chunk, epoch,
               error_ptr, max_spins)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        kk = k * BLOCK_K + rk
        a = tl.load(a_ptr + rm[:, None] * K + kk[None, :], mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
        b = tl.load(b_ptr + kk[:, None] * N + rn[None, :], mask=(kk[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc += tl.dot(a, b)
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc.to(c_ptr.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


class TritonAllGatherMatmul:
    """One rank's all-gather + matmul: symmetric A of M x K, flags for world_size * chunks chunks."""

    def __init__(self, m, k, chunks):
        self.world_size, self.rank = dist.get_world_size(), dist.get_rank()
        self.m, self.k, self.chunks = m, k, chunks
        self.rows = m // self.world_size
        self.chunk_rows = self.rows // chunks
        if self.rows % chunks or self.chunk_rows < BLOCK_M:
            raise ValueError(f"{self.rows} rows per rank in {chunks} chunks: each chunk needs >= {BLOCK_M} rows")
        self.gathered = asynctp.symmetric.empty(m, k, dtype=torch.bfloat16, signal_count=self.world_size * chunks)
        self.handle = asynctp.symmetric.rendezvous(self.gathered)
        self.error = torch.zeros(1, dtype=torch.int32, device="cuda")
        self.epoch = 0

    def __call__(self, a_shard, b):
        h, me = self.handle, self.rank
        self.epoch += 1
        # The peers are done reading their buffers from the last call before anyone pushes again.
        h.barrier()
        c = torch.empty(self.m, b.shape[1], dtype=torch.bfloat16, device="cuda")
        push = torch.cuda.Stream()
        push.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(push):
            for chunk in range(self.chunks):
                rows = slice(chunk * self.chunk_rows, (chunk + 1) * self.chunk_rows)
                for i in range(self.world_size):  # this rank first (its own buffer), then rank me+1, ...
                    dst = (me + i) % self.world_size
                    peer = h.get_buffer(dst, (self.m, self.k), torch.bfloat16)
                    peer[me * self.rows:(me + 1) * self.rows][rows].copy_(a_shard[rows])
                    h.put_signal(dst, index=me * self.chunks + chunk, value=self.epoch, stream=push)
        flags = h.get_signal_pad(me)
        grid = (triton.cdiv(self.m, BLOCK_M) * triton.cdiv(b.shape[1], BLOCK_N),)
        _gathered_matmul[grid](self.gathered, b, c, flags, self.error, self.m, b.shape[1], self.k, self.rows,
                               self.chunk_rows, self.chunks, self.epoch, MAX_SPINS, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
                               BLOCK_K=BLOCK_K)
        torch.cuda.current_stream().wait_stream(push)
        return c


def _median_us(fn, iters=30):
    times = []
    for _ in range(iters):
        dist.barrier()
        torch.cuda.synchronize()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1000)
    return sorted(times)[len(times) // 2]


def main():
    rank, world_size = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", rank=rank, world_size=world_size, device_id=device)
    args = [int(x) for x in sys.argv[1:]]
    m, n, k = args[:3] if len(args) >= 3 else (4096, 3584, 8192)
    chunks = args[3] if len(args) >= 4 else 2
    g = torch.Generator().manual_seed(1234)
    a_full = torch.randn(m, k, generator=g).to(torch.bfloat16)
    b = torch.randn(k, n, generator=g).to("cuda", torch.bfloat16) / k ** 0.5
    rows = m // world_size
    a_shard = a_full[rank * rows:(rank + 1) * rows].cuda()
    op = TritonAllGatherMatmul(m, k, chunks)
    c = op(a_shard, b)
    torch.cuda.synchronize()
    ref = (a_full.cuda().float() @ b.float())
    err = ((c.float() - ref).abs().max() / ref.abs().max()).item()
    if op.error.item() != 0:
        raise SystemExit(f"rank {rank}: a flag never came (the wait gave up)")
    if err > 2e-2:
        raise SystemExit(f"rank {rank}: max error {err:.3g} of the largest value")
    triton_us = _median_us(lambda: op(a_shard, b))
    fused_us = _median_us(lambda: asynctp.all_gather_matmul(a_shard, [b], 0, return_a=False, algorithm="fused"))
    if rank == 0:
        print(f"{world_size} rank(s), {torch.cuda.get_device_name()}, all_gather_matmul {m}x{n}x{k} bf16, "
              f"{chunks} chunks per rank: max error {err:.2g} of the largest value; median of 30: Triton "
              f"{triton_us:.1f} us, asynctp fused {fused_us:.1f} us")
    torch.cuda.synchronize()
    asynctp.shutdown()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
