"""asynctp.inductor.enable_async_tp on GPUs: a tensor-parallel MLP written with PyTorch's functional
collectives and plain matmuls, compiled by inductor with the switch on, must call asynctp's ops (seen in
the generated code) and give the results of the same model run eagerly on NCCL and cuBLAS. Skipped
without PyTorch or enough GPUs."""

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: the torch.compile pass is not tested here")

import asynctp.comm  # noqa: E402 (asynctp.comm.group_name in the ranks)
from multiprocess import COMPILED_AS_THREADS, run_ranks  # noqa: E402


def _gen(seed, *shape):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g)


def _compiled_with_asynctp(name, run):
    """run() under the compile switch; returns its result and asserts the compiled code calls asynctp's
    ops, never PyTorch's fused ones."""
    from torch._inductor.utils import run_and_get_code

    import asynctp.inductor

    asynctp.inductor.enable_async_tp(name)
    try:
        result, code = run_and_get_code(run)
    finally:
        asynctp.inductor.disable_async_tp()
    source = "\n".join(code)
    assert "asynctp.all_gather_matmul" in source, "the compiled code does not call asynctp's all_gather_matmul"
    assert "asynctp.matmul_reduce_scatter" in source, "the compiled code does not call asynctp's matmul_reduce_scatter"
    assert "symm_mem.fused" not in source, "PyTorch's fused ops are still in the compiled code"
    return result


def _assert_close(what, got, want, rtol):
    """Different kernels and summation orders: a bf16 tolerance of the largest value."""
    err = (got.float() - want.float()).abs().max().item()
    tol = rtol * want.float().abs().max().item()
    assert err <= tol, f"{what}: compiled with asynctp against eager: max abs error {err:.4g} > {tol:.4g}"


def _mlp(rank, world):
    import torch.distributed._functional_collectives as funcol

    dev = torch.device("cuda", rank)
    name = asynctp.comm.group_name()
    # Sequence-parallel MLP: rows gathered before the up projection (two Bs, nn.Linear weights),
    # partial sums reduce-scattered after the down projection.
    x = (_gen(70 + rank, 512, 1024) / 8).to(dev, torch.bfloat16)
    w_gate, w_up = (_gen(71, 1024, 1024) / 32).to(dev, torch.bfloat16), (_gen(72, 1024, 1024) / 32).to(dev, torch.bfloat16)
    w_down = (_gen(73, 1024, 1024) / 32).to(dev, torch.bfloat16)

    def mlp(x):
        a = funcol.all_gather_tensor(x, 0, name)
        h = torch.nn.functional.silu(a @ w_gate.t()) * (a @ w_up.t())
        return funcol.reduce_scatter_tensor(h @ w_down.t(), "sum", 0, name)

    eager = mlp(x)
    compiled = _compiled_with_asynctp(name, lambda: torch.compile(mlp, fullgraph=True)(x))
    _assert_close("output", compiled, eager, 2e-2)


@pytest.mark.parametrize("world", [1, 2, COMPILED_AS_THREADS])
def test_compiled_tp_mlp_runs_asynctps_ops_and_matches_eager(world):
    run_ranks(world, _mlp)


def _attention_projections_with_grads(rank, world):
    import torch.distributed._functional_collectives as funcol

    dev = torch.device("cuda", rank)
    name = asynctp.comm.group_name()
    # Sequence-parallel attention projections: rows gathered once for q, k and v (three Bs), the
    # output projection's partial sums reduce-scattered. The attention itself is left out: what is
    # checked is the projections' forward and every gradient, through autograd-aware collectives.
    hidden, heads_dim = 1024, 1024 // max(world, 1)
    x0 = (_gen(80 + rank, 512, hidden) / 8).to(dev, torch.bfloat16)
    ws0 = [(_gen(81 + i, heads_dim, hidden) / 32).to(dev, torch.bfloat16) for i in range(3)]
    wo0 = (_gen(85, hidden, heads_dim) / 32).to(dev, torch.bfloat16)

    def block(x, wq, wk, wv, wo):
        a = funcol.all_gather_tensor_autograd(x, 0, name)
        q, k, v = a @ wq.t(), a @ wk.t(), a @ wv.t()
        mixed = torch.nn.functional.silu(q) * k + v
        return funcol.reduce_scatter_tensor_autograd(mixed @ wo.t(), "sum", 0, name)

    def run(fn):
        x = x0.clone().requires_grad_()
        params = [w.clone().requires_grad_() for w in (*ws0, wo0)]
        y = fn(x, *params)
        upstream = (_gen(90 + rank, *y.shape) / 4).to(dev, torch.bfloat16)
        (y.float() * upstream.float()).sum().backward()
        return [y, x.grad, *[p.grad for p in params]]

    eager = run(block)
    compiled = _compiled_with_asynctp(name, lambda: run(torch.compile(block, fullgraph=True)))
    for what, c, e in zip(["output", "x.grad", "wq.grad", "wk.grad", "wv.grad", "wo.grad"], compiled, eager):
        _assert_close(what, c, e, 3e-2)


@pytest.mark.parametrize("world", [1, 2, COMPILED_AS_THREADS])
def test_compiled_attention_projections_forward_and_gradients_match_eager(world):
    run_ranks(world, _attention_projections_with_grads)
