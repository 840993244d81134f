"""asynctp.symmetric on real GPUs, one process per rank: every call of the handle, peers' buffers as
tensors written with plain tensor copies, signals in stream order and under CUDA graph capture, a
symmetric tensor read in place by the pipelined all_gather_matmul, bad arguments refused by name, and a
wait on a signal nobody sends ending with asynctp.Error. Skipped, saying why, without PyTorch or GPUs."""

import os
import sys
import time

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: asynctp.symmetric is not tested here")

import asynctp  # noqa: E402
from multiprocess import run_ranks  # noqa: E402


def _every_call(rank, world_size):
    sym = asynctp.symmetric
    buf = sym.empty(64, 33, dtype=torch.bfloat16, signal_count=8)
    assert buf.shape == (64, 33) and buf.dtype == torch.bfloat16 and buf.is_cuda
    assert torch.count_nonzero(buf) == 0, "a new symmetric tensor is not zeroed"
    h = sym.rendezvous(buf)
    assert sym.rendezvous(buf[3:]) is h, "a view of the buffer finds its handle"
    assert (h.rank, h.world_size, h.signal_count) == (rank, world_size, 8)
    assert h.buffer_ptrs[rank] == buf.data_ptr() and len(h.signal_pad_ptrs) == world_size
    assert h.buffer_ptrs_dev and h.signal_pad_ptrs_dev and h.wait_context.fault
    nxt, prev = (rank + 1) % world_size, (rank - 1) % world_size
    # Write the next rank's buffer with a plain tensor copy (the copy engine), flag it, wait for ours.
    for step in range(1, 51):
        h.get_buffer(nxt, (64, 33), torch.bfloat16).copy_(torch.full((64, 33), float(step + rank), device="cuda"))
        h.put_signal(nxt, index=0, value=step)
        h.wait_signal(rank, index=0, value=step)
        assert torch.all(buf == float(step + prev)), f"step {step}: the previous rank's data is not all here"
        h.barrier()  # the next step's copy into a peer's buffer waits for the peer's check of this one
    pad = h.get_signal_pad(rank)
    assert pad.shape == (8,) and int(pad[0]) == 50, pad
    h.barrier()
    # Under capture: a graph with its own value, replayed once. The barrier on a new stream follows the
    # one on the default stream (the legacy one, stream 0) on the GPU, as the communicator orders its calls.
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        h.barrier()
        torch.cuda.synchronize()
        with torch.cuda.graph(graph, stream=stream):
            h.get_buffer(nxt, (64, 33), torch.bfloat16).fill_(float(1000 + rank))
            h.put_signal(nxt, index=1, value=7)
            h.wait_signal(rank, index=1, value=7)
    h.barrier()
    torch.cuda.synchronize()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.all(buf == float(1000 + prev)), "the graph's signal did not order its data"
    h.barrier()
    # A symmetric a_shard: the pipelined all_gather_matmul reads it in place.
    a = sym.empty(128, 256, dtype=torch.bfloat16)
    a.copy_(torch.randn(128, 256, generator=torch.Generator().manual_seed(rank)).to("cuda", torch.bfloat16))
    b = torch.randn(256, 64, generator=torch.Generator().manual_seed(99)).to("cuda", torch.bfloat16)
    gathered, (out,) = asynctp.all_gather_matmul(a, [b], 0, algorithm="pipelined", return_a=True)
    ref = torch.cat([torch.randn(128, 256, generator=torch.Generator().manual_seed(r)) for r in range(world_size)])
    assert torch.equal(gathered.float().cpu(), ref.to(torch.bfloat16).float())
    torch.testing.assert_close(out.float().cpu(), ref.to(torch.bfloat16).float() @ b.float().cpu(), rtol=2e-2, atol=2e-1)
    # Bad arguments, refused by name.
    for call, words in [(lambda: h.get_buffer(world_size, (1,), torch.bfloat16), "rank"),
                        (lambda: h.get_buffer(rank, (10 ** 9,), torch.bfloat16), "the region has"),
                        (lambda: h.put_signal(nxt, index=8), "index is 8; expected 0 to 7"),
                        (lambda: h.wait_signal(-1), "owner is -1")]:
        with pytest.raises(asynctp.Error, match=words):
            call()
    h.close()
    with pytest.raises(asynctp.Error, match="closed"):
        h.barrier()
    asynctp.shutdown()


def test_every_call_of_a_symmetric_handle_on_one_rank():
    run_ranks(1, _every_call)


def test_every_call_of_a_symmetric_handle_on_two_ranks():
    run_ranks(2, _every_call)


def _unanswered_wait(rank, world_size):
    buf = asynctp.symmetric.empty(16, dtype=torch.float32, signal_count=4)
    h = asynctp.symmetric.rendezvous(buf)
    t0 = time.monotonic()
    h.wait_signal(rank, index=3, value=1)
    with pytest.raises(asynctp.Error, match="flag 3 of rank 0 is 0, expected >= 1"):
        asynctp.communicator().synchronize()
    assert time.monotonic() - t0 < 10
    # The context is gone with the trap: the process ends here, without the collective teardown.
    sys.stdout.flush()
    os._exit(0)


def test_a_wait_on_a_signal_nobody_sends_ends_with_the_report(monkeypatch):
    monkeypatch.setenv("ASYNCTP_TIMEOUT_MS", "1500")
    run_ranks(1, _unanswered_wait)
