"""The torch ops on real GPUs, one process per rank, against fp32 references computed by torch from the
whole inputs (every rank generates every rank's shard from the same seeds, so no communication is
involved in the reference). Skipped, saying why, without PyTorch or without enough GPUs.

Each test runs the ops both ways they may be registered (asynctp._extension): in C++ by
libasynctp_torch.so, and in Python (ASYNCTP_TORCH_EXTENSION=0)."""

import time

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: the torch ops are not tested here")

import asynctp  # noqa: E402
from asynctp.comm import group_name  # noqa: E402
from multiprocess import COMPILED_AS_THREADS, ranks_are_threads, run_ranks, run_threads  # noqa: E402

ALGORITHMS = ["sequential", "pipelined", "fused", "auto"]
DTYPES = [torch.bfloat16, torch.float16]


def _gen(seed, *shape):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g)


def _gen_bf16(seed, *shape):
    """fp32 values that bf16 holds exactly: the reference then sees the inputs the op sees."""
    return _gen(seed, *shape).bfloat16().float()


def _assert_close(got, ref, what):
    # Inputs are rounded to the dtype before the reference, so what differs is fp32 summation order
    # and the one rounding of the output: a fraction of the dtype's epsilon of the largest value.
    tol = (1.5e-2 if got.dtype == torch.bfloat16 else 4e-3) * ref.abs().max().item()
    err = (got.float() - ref).abs().max().item()
    assert err <= tol, f"{what}: max abs error {err:.4g} > {tol:.4g}"
    assert got.shape == ref.shape, f"{what}: shape {tuple(got.shape)}, expected {tuple(ref.shape)}"


def _device():
    # One GPU a rank, or every rank on GPU 0 where the ranks are threads.
    return torch.device("cuda", torch.cuda.current_device())


def _meta_like(t):
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")


@pytest.fixture(params=["C++", "Python"])
def ops_path(request, monkeypatch):
    """Which registration the ranks' processes use; they check that it is the one in effect."""
    if request.param == "Python":
        monkeypatch.setenv("ASYNCTP_TORCH_EXTENSION", "0")
    else:
        from asynctp import _extension

        if not _extension.path().exists():
            pytest.skip(f"libasynctp_torch.so is not built ({_extension.path()}): the C++ ops are not tested here")
        monkeypatch.delenv("ASYNCTP_TORCH_EXTENSION", raising=False)
    return request.param


def _uses(ops_path):
    from asynctp import ops

    assert ops.EXTENSION == (ops_path == "C++"), f"asked for the {ops_path} ops; ops.EXTENSION is {ops.EXTENSION}"


# How the ranks run: a process per GPU (NCCL), or threads of one process on one GPU (the threaded
# process group, on asynctp's in-process transport).
ONE, TWO = pytest.param(("processes", 1), id="1-process"), pytest.param(("processes", 2), id="2-processes")
TWO_THREADS, FOUR_THREADS = pytest.param(("threads", 2), id="2-threads"), pytest.param(("threads", 4), id="4-threads")


def _run(ranks, body, *args):
    how, world = ranks
    (run_threads if how == "threads" else run_ranks)(world, body, *args)


def _all_gather_cases(rank, world, ops_path):
    _uses(ops_path)
    dev = _device()
    # gather_dim 0 of a 2-dim A, the middle dim of a 3-dim A (moved to the front and back, as torch
    # does), and the last dim (K gathered); two nn.Linear weights plus one row-major B.
    for shard_shape, gather_dim in [((192, 256), 0), ((3, 64, 256), 1), ((128, 128), -1)]:
        for dtype in DTYPES:
            shards = [_gen(10 + r, *shard_shape).to(dtype) for r in range(world)]
            a_full_ref = torch.cat(shards, dim=gather_dim).float()
            k = a_full_ref.shape[-1]
            w1, w2 = _gen(20, 320, k).to(dtype), _gen(21, 64, k).to(dtype)
            for algorithm in ALGORITHMS:
                for bs, refs in [([w1.to(dev).t(), w2.to(dev).t()], [a_full_ref @ w1.float().t(), a_full_ref @ w2.float().t()]),
                                 ([w2.t().contiguous().to(dev)], [a_full_ref @ w2.float().t()])]:
                    for return_a in (True, False):
                        what = f"all_gather_matmul {dtype} {algorithm} shard {shard_shape} gather_dim {gather_dim} {len(bs)} B"
                        a_shard = shards[rank].to(dev)
                        a_full, outs = asynctp.all_gather_matmul(a_shard, bs, gather_dim, return_a=return_a,
                                                                 algorithm=algorithm)
                        for i, (out, ref) in enumerate(zip(outs, refs)):
                            _assert_close(out, ref.to(dev), f"{what}: output {i}")
                        if return_a:
                            assert torch.equal(a_full.float(), a_full_ref.to(dev)), f"{what}: gathered A"
                        else:
                            assert a_full is None
                        # The real op lays its results out as its fake implementation says (torch.compile relies on it).
                        fake_a, fake_outs = torch.ops.asynctp.all_gather_matmul(
                            _meta_like(a_shard), [_meta_like(b) for b in bs], gather_dim, group_name(),
                            return_a, algorithm, 0)
                        assert [o.stride() for o in outs] == [o.stride() for o in fake_outs], what
                        if return_a:
                            assert a_full.stride() == fake_a.stride(), what


def _reduce_scatter_cases(rank, world, ops_path):
    _uses(ops_path)
    dev = _device()
    for a_shape, scatter_dim in [((512, 128), 0), ((4, 96, 128), 1), ((256, 64), -1)]:
        n = 192
        for dtype in DTYPES:
            a_parts = [_gen(30 + r, *a_shape).to(dtype) for r in range(world)]
            b_parts = [_gen(40 + r, a_shape[-1], n).to(dtype) for r in range(world)]
            full = sum(a.float() @ b.float() for a, b in zip(a_parts, b_parts))
            for reduce_op in ("sum", "avg"):
                total = full / world if reduce_op == "avg" else full
                ref = total.chunk(world, dim=scatter_dim)[rank].to(dev)
                for algorithm in ALGORITHMS:
                    for b_local in (b_parts[rank].to(dev), b_parts[rank].t().contiguous().to(dev).t()):
                        what = f"matmul_reduce_scatter {dtype} {algorithm} {reduce_op} a {a_shape} scatter_dim {scatter_dim}"
                        out = asynctp.matmul_reduce_scatter(a_parts[rank].to(dev), b_local, reduce_op, scatter_dim,
                                                            algorithm=algorithm)
                        _assert_close(out, ref, what)


@pytest.mark.parametrize("ranks", [ONE, TWO, TWO_THREADS, FOUR_THREADS])
def test_all_gather_matmul_matches_the_reference(ranks, ops_path):
    _run(ranks, _all_gather_cases, ops_path)


@pytest.mark.parametrize("ranks", [ONE, TWO, TWO_THREADS, FOUR_THREADS])
def test_matmul_reduce_scatter_matches_the_reference(ranks, ops_path):
    _run(ranks, _reduce_scatter_cases, ops_path)


def test_both_ops_on_one_rank(ops_path):
    run_ranks(1, _one_rank_cases, ops_path)


def _one_rank_cases(rank, world, ops_path):
    _uses(ops_path)
    # World size 1: the all-gather is the shard itself and the reduce-scatter the product itself.
    dev = torch.device("cuda", 0)
    a, w = _gen(1, 256, 128).to(torch.bfloat16), _gen(2, 64, 128).to(torch.bfloat16)
    for algorithm in ALGORITHMS:
        a_full, (out,) = asynctp.all_gather_matmul(a.to(dev), [w.to(dev).t()], 0, algorithm=algorithm)
        assert torch.equal(a_full.cpu(), a)
        _assert_close(out, (a.float() @ w.float().t()).to(dev), f"all_gather_matmul one rank {algorithm}")
        y = asynctp.matmul_reduce_scatter(a.to(dev), w.to(dev).t(), "sum", 0, algorithm=algorithm)
        _assert_close(y, (a.float() @ w.float().t()).to(dev), f"matmul_reduce_scatter one rank {algorithm}")


def _errors(rank, world, ops_path):
    _uses(ops_path)
    dev = _device()
    a = torch.randn(128, 64, device=dev, dtype=torch.bfloat16)
    w = torch.randn(32, 64, device=dev, dtype=torch.bfloat16)
    if world > 1:
        # A rank with different shapes: every rank gets the C++ library's error, its message unchanged.
        mine = a if rank == 0 else a[:64]
        with pytest.raises(asynctp.Error) as caught:
            asynctp.all_gather_matmul(mine, [w.t()], 0, algorithm="sequential")
        assert str(caught.value).startswith(f"rank {rank}: "), str(caught.value)
        assert "all_gather_matmul" in str(caught.value)
    # Wrong arguments the same on every rank.
    with pytest.raises(asynctp.Error, match="algorithm is 'fastest'; expected one of sequential, pipelined, fused, auto"):
        asynctp.all_gather_matmul(a, [w.t()], 0, algorithm="fastest")
    with pytest.raises(asynctp.Error, match="reduce_op is 'max'; expected 'sum' or 'avg'"):
        asynctp.matmul_reduce_scatter(a, w.t(), "max", 0)
    with pytest.raises(asynctp.Error, match="a_shard is torch.int8; expected torch.bfloat16 or torch.float16"):
        asynctp.all_gather_matmul(a.to(torch.int8), [w.t()], 0)
    with pytest.raises(asynctp.Error, match="is fp16 but expected bf16"):
        asynctp.all_gather_matmul(a, [w.t().half()], 0)
    with pytest.raises(asynctp.Error, match="gather_dim is 2; expected a dim of a 2-dim tensor"):
        asynctp.all_gather_matmul(a, [w.t()], 2)
    with pytest.raises(asynctp.Error, match="bs is empty; expected at least one B"):
        asynctp.all_gather_matmul(a, [], 0)
    # The binding checks each tensor's device itself (the library does not look the pointers up again).
    with pytest.raises(asynctp.Error, match=r"bs\[0\] is on cpu; the communicator of its group was made on cuda:"):
        asynctp.all_gather_matmul(a, [w.t().cpu()], 0)
    with pytest.raises(asynctp.Error, match="b is on cpu; the communicator of its group was made on cuda:"):
        asynctp.matmul_reduce_scatter(a, w.t().cpu(), "sum", 0)
    # Through torch.ops the same errors, as RuntimeError (asynctp.Error is one).
    with pytest.raises(RuntimeError, match="algorithm is 'fastest'"):
        torch.ops.asynctp.all_gather_matmul(a, [w.t()], 0, group_name(), False, "fastest", 0)
    if world > 1:
        # Wrong arguments on one rank only: the package's own refusal reaches the other rank at once
        # (well inside ASYNCTP_TIMEOUT_MS, 20 s here), through the op's agreement across ranks.
        start = time.monotonic()
        with pytest.raises(asynctp.Error) as caught:
            asynctp.matmul_reduce_scatter(a, w.t(), "max" if rank == 0 else "sum", 0, algorithm="sequential")
        took = time.monotonic() - start
        assert took < 5.0, f"the refusal took {took:.1f} s to arrive"
        expected = "reduce_op is 'max'" if rank == 0 else "rank 0 refused its arguments"
        assert expected in str(caught.value), str(caught.value)
    # After the errors, the communicator still works.
    _, (out,) = asynctp.all_gather_matmul(a, [w.t()], 0)
    assert out.shape == (128 * world, 32)
    # The op runs on the current stream: captured into a CUDA graph on torch's capture stream, then
    # replayed on new input. Work the capture missed would leave the output without the new result.
    # (Not where the ranks are threads: torch captures in the global mode, which another thread's
    # CUDA calls would break.)
    if not ranks_are_threads():
        _graph_replays(a, w)
    # A destroyed communicator is refused by name, and the next op on the group makes a new one.
    comm = asynctp.communicator()
    asynctp.shutdown()
    with pytest.raises(asynctp.Error, match="this asynctp communicator was destroyed"):
        comm.handle  # noqa: B018
    _, (again,) = asynctp.all_gather_matmul(a, [w.t()], 0)
    assert torch.equal(again, out)


def _graph_replays(a, w):
    static_a = a.clone()
    asynctp.all_gather_matmul(static_a, [w.t()], 0, algorithm="pipelined")  # grows the workspace first
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _, (graphed,) = asynctp.all_gather_matmul(static_a, [w.t()], 0, algorithm="pipelined")
    new_a = torch.randn_like(a)
    _, (expected,) = asynctp.all_gather_matmul(new_a, [w.t()], 0, algorithm="pipelined")
    static_a.copy_(new_a)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(graphed, expected)


@pytest.mark.parametrize("ranks", [ONE, TWO, TWO_THREADS])
def test_bad_arguments_raise_asynctp_error_on_every_rank(ranks, ops_path):
    _run(ranks, _errors, ops_path)


def _compiled(rank, world, ops_path):
    _uses(ops_path)
    dev = _device()
    x = _gen(50 + rank, 256, 256).to(dev, torch.bfloat16)
    w_up, w_down = _gen(51, 512, 256).to(dev, torch.bfloat16), _gen(52, 256, 512).to(dev, torch.bfloat16)
    name = group_name()

    def block(x):
        _, (h,) = asynctp.all_gather_matmul(x, [w_up.t()], 0, name, return_a=False)
        return asynctp.matmul_reduce_scatter(torch.relu(h), w_down.t(), "sum", 0, name)

    eager = block(x)
    compiled = torch.compile(block, fullgraph=True)(x)
    # The same op with the same algorithm on the same inputs: the same bits.
    assert torch.equal(eager, compiled)


@pytest.mark.parametrize("world", [1, 2, COMPILED_AS_THREADS])
def test_torch_compile_fullgraph_runs_the_ops(world, ops_path):
    run_ranks(world, _compiled, ops_path)


def _gradients(rank, world, ops_path):
    _uses(ops_path)
    dev = _device()
    for gather_dim in (0, -1):
        for algorithm in ("sequential", "fused"):
            # all_gather_matmul's backward (a matmul_reduce_scatter) against autograd on the whole tensors.
            shard_shape = (128, 64)
            shards = [_gen_bf16(60 + r, *shard_shape) for r in range(world)]
            a_full = torch.cat(shards, dim=gather_dim).to(dev).requires_grad_()
            ws = [_gen_bf16(70 + r, 96, a_full.shape[-1]).to(dev).requires_grad_() for r in range(world)]
            grads = [_gen_bf16(80 + r, a_full.shape[0], 96).to(dev) for r in range(world)]
            sum((a_full @ w.t() * g).sum() for w, g in zip(ws, grads)).backward()

            a_shard = shards[rank].to(dev, torch.bfloat16).requires_grad_()
            w = ws[rank].detach().to(torch.bfloat16).requires_grad_()
            _, (out,) = asynctp.all_gather_matmul(a_shard, [w.t()], gather_dim, return_a=False, algorithm=algorithm)
            (out.float() * grads[rank]).sum().backward()
            what = f"all_gather_matmul backward gather_dim {gather_dim} {algorithm}"
            _assert_close(a_shard.grad, a_full.grad.chunk(world, dim=gather_dim)[rank], what + ": d a_shard")
            _assert_close(w.grad, ws[rank].grad, what + ": d B")

            # matmul_reduce_scatter's backward (an all_gather_matmul).
            a_parts = [_gen_bf16(90 + r, 128, 64).to(dev).requires_grad_() for r in range(world)]
            b_parts = [_gen_bf16(100 + r, 64, 96).to(dev).requires_grad_() for r in range(world)]
            g_out = _gen_bf16(110, 128, 96).to(dev)
            total = sum(a @ b for a, b in zip(a_parts, b_parts)) / world
            (total * g_out).sum().backward()
            a = a_parts[rank].detach().to(torch.bfloat16).requires_grad_()
            b = b_parts[rank].detach().to(torch.bfloat16).requires_grad_()
            y = asynctp.matmul_reduce_scatter(a, b, "avg", gather_dim, algorithm=algorithm)
            (y.float() * g_out.chunk(world, dim=gather_dim)[rank]).sum().backward()
            what = f"matmul_reduce_scatter backward scatter_dim {gather_dim} {algorithm}"
            _assert_close(a.grad, a_parts[rank].grad, what + ": d a")
            _assert_close(b.grad, b_parts[rank].grad, what + ": d b")


@pytest.mark.parametrize("ranks", [ONE, TWO, TWO_THREADS])
def test_gradients_match_autograd_on_the_whole_tensors(ranks, ops_path):
    _run(ranks, _gradients, ops_path)


def _shared_nccl(rank, world):
    import torch.distributed as dist

    dev = _device()
    shared = asynctp.communicator()
    assert shared.shares_nccl_comm, "the default group's communicator is not on the process group's NCCL communicator"
    other = dist.new_group(list(range(world)))
    own = asynctp.communicator(other, share_nccl=False)
    assert not own.shares_nccl_comm
    x = _gen(80 + rank, 256, 128).to(dev, torch.bfloat16)
    w = _gen(81, 128, 64).to(dev, torch.bfloat16)
    for algorithm in ALGORITHMS:
        _, (on_shared,) = asynctp.all_gather_matmul(x, [w], 0, None, algorithm=algorithm)
        _, (on_own,) = asynctp.all_gather_matmul(x, [w], 0, other, algorithm=algorithm)
        assert torch.equal(on_shared, on_own), algorithm
    asynctp.shutdown(other)


def test_the_process_groups_nccl_communicator_is_shared_and_gives_the_same_results():
    run_ranks(2, _shared_nccl)
