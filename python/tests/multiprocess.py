"""Runs a test body on one process per GPU, as torchrun would, and fails the test where any rank fails;
or on threads of one process on one GPU, as the ranks of PyTorch's threaded test process group (which
asynctp runs on its in-process transport).

Each rank joins an NCCL process group (threads: the threaded one); a rank that raises makes spawn stop
the others. Waits are bounded (the process group's timeout, ASYNCTP_TIMEOUT_MS) so that a broken op
fails instead of hanging."""

import datetime
import os
import queue
import tempfile
import threading
import time
import traceback

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import asynctp


# A compiled test's parameter for the ranks as threads, skipped: torch.compile keeps per process what
# such a test needs per rank (inductor's config, which the compile switch sets and unsets; the code that
# run_and_get_code captures; dynamo's compiled code of a function, which a second rank's thread reuses
# instead of compiling, so that its generated code cannot be checked).
COMPILED_AS_THREADS = pytest.param("2-threads", marks=pytest.mark.skip(
    reason="torch.compile keeps its config, captured code and compiled code per process, not per thread-rank; "
           "the compiled tests run at 2 ranks as 2 processes on 2 GPUs"))


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


def run_threads(world_size, body, *args, within_s=300):
    """body(rank, world_size, *args) on world_size threads of a fresh process, every rank on GPU 0 on a
    stream of its own, as the ranks of PyTorch's threaded process group."""
    require_gpus(1)
    os.environ.setdefault("ASYNCTP_TIMEOUT_MS", "20000")
    context = mp.get_context("spawn")
    errors = context.Queue()
    process = context.Process(target=_threads_main, args=(world_size, body, args, errors))
    process.start()
    try:
        failures = errors.get(timeout=within_s)  # read before the join: a queue's writer exits once read
    except queue.Empty:
        failures = None
    process.join(10)
    if process.is_alive():
        process.kill()
        pytest.fail(f"ranks as threads still running after {within_s} s")
    if failures is None:
        failures = f"the ranks' process ended with exit code {process.exitcode} and no report"
    if failures:
        pytest.fail(failures, pytrace=False)


def ranks_are_threads():
    """Whether this body runs as a thread of the threaded process group."""
    return asynctp.comm._threaded(dist.group.WORLD)


def _threads_main(world_size, body, args, errors):
    # What the in-process transport needs before the process's first CUDA call (asynctp/in_process.h);
    # set here, in the ranks' own process, so that the test's process and its others keep their own.
    if torch.cuda.is_initialized():
        errors.put("CUDA started in the ranks' process before the in-process transport's variables were set")
        return
    os.environ.setdefault("CUDA_MODULE_LOADING", "EAGER")
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")
    from torch.testing._internal.distributed import multi_threaded_pg  # registers the "threaded" backend

    torch._C._distributed_c10d._set_thread_isolation_mode(True)  # each thread's groups are its own
    multi_threaded_pg._install_threaded_pg()
    store = dist.HashStore()
    failures = []

    def rank_main(rank):
        try:
            torch.cuda.set_device(0)
            dist.init_process_group("threaded", rank=rank, world_size=world_size, store=store)
            # A stream of its own: on one stream a rank's kernel would wait behind another's for good.
            with torch.cuda.stream(torch.cuda.Stream()):
                body(rank, world_size, *args)
                torch.cuda.synchronize()
                asynctp.shutdown()
            # No destroy_process_group: PyTorch 2.11's reads a list the threaded world does not keep; the
            # process ends with the test.
        except BaseException:  # noqa: BLE001 (reported to the test, which fails)
            failures.append(f"rank {rank}:\n{traceback.format_exc()}")

    threads = [threading.Thread(target=rank_main, args=(rank,), daemon=True) for rank in range(world_size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    errors.put("\n".join(failures))
