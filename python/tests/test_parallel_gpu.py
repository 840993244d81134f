"""asynctp.parallel's styles on GPUs: a Llama MLP and an attention block's projections (q, k, v
column-wise, the output row-wise), with biases, parallelized with asynctp's styles in sequence-parallel
layouts, against the same model on one GPU run by plain PyTorch: output rows and every gradient, each
rank's part, within bf16 tolerance (fp32 accumulation in different orders). Skipped without PyTorch or
enough GPUs."""

import threading

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: the DTensor styles are not tested here")

from multiprocess import run_ranks, run_threads  # noqa: E402


def _close(got, ref, what):
    got, ref = got.float(), ref.float()
    tol = 2e-2 * ref.abs().max().item()
    err = (got - ref).abs().max().item()
    assert got.shape == ref.shape, f"{what}: shape {tuple(got.shape)}, expected {tuple(ref.shape)}"
    assert err <= tol, f"{what}: max abs error {err:.4g} > {tol:.4g}"


_global_rng = threading.Lock()


def _block(rank, world, kind):
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import parallelize_module

    import asynctp.parallel as ap

    dev = torch.device("cuda", torch.cuda.current_device())  # GPU 0 where the ranks are threads

    # The attention itself is left out: what is checked is its projections, whose input is gathered
    # once for q, k and v and whose output projection's partial sums are reduce-scattered.
    if kind == "mlp":
        columns, rows_out = ("w1", "w3"), "w2"
        forward = lambda m, x: m["w2"](nn.functional.silu(m["w1"](x)) * m["w3"](x))  # noqa: E731
    else:
        columns, rows_out = ("wq", "wk", "wv"), "wo"
        forward = lambda m, x: m["wo"](nn.functional.silu(m["wq"](x)) * m["wk"](x) + m["wv"](x))  # noqa: E731

    def model():
        with _global_rng:  # ranks as threads share the process's generator: one seeds and draws at a time
            torch.manual_seed(0)
            layers = {name: nn.Linear(512, 1024) for name in columns}
            layers[rows_out] = nn.Linear(1024, 512)
        return nn.ModuleDict(layers).to(dev, torch.bfloat16)

    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 256 * world, 512, generator=g).to(dev, torch.bfloat16)
    upstream = torch.randn(2, 256 * world, 512, generator=g).to(dev, torch.bfloat16)

    ref = model()
    x_ref = x.clone().requires_grad_()
    (forward(ref, x_ref).float() * upstream.float()).sum().backward()
    y_ref = forward(ref, x).detach()

    for algorithm in ("sequential", "fused"):
        par = model()
        mesh = init_device_mesh("cuda", (world,))
        plan = {name: ap.ColwiseParallel(input_layouts=Shard(1), algorithm=algorithm) for name in columns}
        plan[rows_out] = ap.RowwiseParallel(output_layouts=Shard(1), algorithm=algorithm)
        parallelize_module(par, mesh, plan)
        rows = slice(rank * 256, (rank + 1) * 256)
        x_local = x[:, rows].clone().requires_grad_()
        y = forward(par, x_local)
        what = f"{kind}, {algorithm}, {world} rank(s)"
        _close(y, y_ref[:, rows], f"{what}: output")
        (y.float() * upstream[:, rows].float()).sum().backward()
        _close(x_local.grad, x_ref.grad[:, rows], f"{what}: input gradient")
        for name, p in par.named_parameters():
            full = dict(ref.named_parameters())[name].grad
            shard = p.grad.full_tensor()
            _close(shard, full, f"{what}: {name} gradient")


@pytest.mark.parametrize("kind", ["mlp", "attention"])
@pytest.mark.parametrize("world", [1, 2])
def test_styles_match_one_gpu_pytorch_forward_and_backward(world, kind):
    run_ranks(world, _block, kind)


@pytest.mark.parametrize("kind", ["mlp", "attention"])
def test_styles_match_one_gpu_pytorch_with_the_ranks_as_threads(kind):
    run_threads(2, _block, kind)
