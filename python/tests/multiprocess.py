"""Runs a test body on one process per GPU, as torchrun would, and fails the test where any rank fails.

Each rank joins an NCCL process group; a rank that raises makes spawn stop the others. Waits are bounded
(the process group's timeout, ASYNCTP_TIMEOUT_MS) so that a broken op fails instead of hanging."""

import datetime
import os
import tempfile
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import asynctp


def require_gpus(n):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU visible: the asynctp torch ops need one per rank")
    if torch.cuda.device_count() < n:
        pytest.skip(f"needs {n} GPUs, {torch.cuda.device_count()} visible")


def run_ranks(world_size, body, *args, within_s=None):
    """body(rank, world_size, *args) on world_size processes, one per GPU; body must be a module-level
    function (spawn pickles it by name). With within_s, ranks still running after that many seconds
    are stopped and the test fails naming them."""
    require_gpus(world_size)
    os.environ.setdefault("ASYNCTP_TIMEOUT_MS", "20000")
    with tempfile.TemporaryDirectory() as tmp:
        context = mp.spawn(_rank_main, args=(world_size, os.path.join(tmp, "rendezvous"), body, args),
                           nprocs=world_size, join=False)
        deadline = None if within_s is None else time.monotonic() + within_s
        while not context.join(timeout=None if deadline is None else max(0.0, deadline - time.monotonic())):
            if deadline is not None and time.monotonic() >= deadline:
                running = [rank for rank, p in enumerate(context.processes) if p.is_alive()]
                for p in context.processes:
                    if p.is_alive():
                        p.kill()
                pytest.fail(f"rank(s) {running} still running after {within_s} s")


def _rank_main(rank, world_size, rendezvous, body, args):
    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", init_method=f"file://{rendezvous}", rank=rank, world_size=world_size,
                            device_id=device, timeout=datetime.timedelta(seconds=60))
    body(rank, world_size, *args)
    torch.cuda.synchronize()
    # Collective clean-up only after success: where a rank failed, its peers may be gone already.
    asynctp.shutdown()
    dist.destroy_process_group()
