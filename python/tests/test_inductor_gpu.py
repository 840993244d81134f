"""asynctp.inductor.enable_async_tp on GPUs: a tensor-parallel MLP written with PyTorch's functional
collectives and plain matmuls, compiled by inductor with the switch on, must call asynctp's ops (seen in
the generated code) and give the results of the same model run eagerly on NCCL and cuBLAS. Skipped
without PyTorch or enough GPUs."""

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: the torch.compile pass is not tested here")

import asynctp  # noqa: E402
from multiprocess import run_ranks  # noqa: E402


def _gen(seed, *shape):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g)


def _mlp(rank, world):
    import torch.distributed._functional_collectives as funcol
    from torch._inductor.utils import run_and_get_code

    import asynctp.inductor

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
    asynctp.inductor.enable_async_tp(name)
    try:
        compiled, code = run_and_get_code(torch.compile(mlp, fullgraph=True), x)
    finally:
        asynctp.inductor.disable_async_tp()
    source = "\n".join(code)
    assert "asynctp.all_gather_matmul" in source, "the compiled graph does not call asynctp's all_gather_matmul"
    assert "asynctp.matmul_reduce_scatter" in source, "the compiled graph does not call asynctp's matmul_reduce_scatter"
    assert "symm_mem.fused" not in source, "PyTorch's fused ops are still in the compiled graph"
    # Different kernels and summation orders: bf16 tolerance of the largest value.
    err = (compiled.float() - eager.float()).abs().max().item()
    tol = 2e-2 * eager.float().abs().max().item()
    assert err <= tol, f"compiled with asynctp against eager: max abs error {err:.4g} > {tol:.4g}"


@pytest.mark.parametrize("world", [1, 2])
def test_compiled_tp_mlp_runs_asynctps_ops_and_matches_eager(world):
    run_ranks(world, _mlp)
