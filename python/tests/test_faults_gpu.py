"""A peer that dies in the middle of an asynctp call on the process group's own NCCL communicator,
which asynctp shares: the surviving rank's own torch.cuda.synchronize() ends within the watchdog's
bound. Either it raises (the watchdog put the CUDA context in error and the process group's abort()
ended NCCL's waiting kernel) and asynctp then raises the watchdog's report, or, where NCCL's kernel
outlives both, the watchdog ends the rank's process (SIGABRT) after printing its report. Skipped,
saying why, without PyTorch or two GPUs."""

import os
import sys
import time

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: the watchdog is not tested from Python")

import asynctp  # noqa: E402
from multiprocess import run_ranks  # noqa: E402

TIMEOUT_MS = 1500


def _peer_exits_mid_op(rank, world_size):
    comm = asynctp.communicator(timeout_ms=TIMEOUT_MS)
    assert comm.shares_nccl_comm, "asynctp made an NCCL communicator of its own; this test needs the group's"
    a = torch.randn(256, 512, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(512, 256, device="cuda", dtype=torch.bfloat16)
    asynctp.all_gather_matmul(a, [b], 0, algorithm="sequential")  # one call together first
    torch.cuda.synchronize()
    if rank == 1:
        torch.cuda._sleep(2 * 10 ** 9)  # about a second: the call passes the host's check, not the GPU's
        asynctp.all_gather_matmul(a, [b], 0, algorithm="sequential")
        print("rank 1: call enqueued, exiting", flush=True)
        os._exit(0)
    t0 = time.monotonic()
    asynctp.all_gather_matmul(a, [b], 0, algorithm="sequential")  # NCCL's kernel waits for rank 1
    error = None
    try:
        torch.cuda.synchronize()
    except RuntimeError as e:  # torch.AcceleratorError
        error = e
    took = time.monotonic() - t0
    print(f"rank 0 after {took:.2f} s: {error}", flush=True)
    assert error is not None, "torch.cuda.synchronize() returned although rank 1 exited mid-call"
    assert took < 1.5 * TIMEOUT_MS / 1000 + 10, f"took {took:.1f} s"  # the watchdog's bound, the trap's start and end
    with pytest.raises(asynctp.Error, match="The watchdog put"):
        comm.synchronize()
    sys.stdout.flush()
    os._exit(0)  # the CUDA context and the process group are gone: no clean-up


def test_a_peer_that_exits_mid_call_ends_the_callers_own_wait():
    # Process start and the group's set-up, then the watchdog's bound, its 5 s grace and the report.
    try:
        run_ranks(2, _peer_exits_mid_op, within_s=60)
    except torch.multiprocessing.ProcessExitedException as e:
        assert e.error_index == 0 and e.signal_name == "SIGABRT", f"not the watchdog's end of rank 0: {e}"
