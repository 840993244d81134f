"""asynctp.parallel's styles on GPUs: a Llama MLP with biases, parallelized with asynctp's styles in
sequence-parallel layouts, against the same model on one GPU run by plain PyTorch: output rows and every
gradient, each rank's part, within bf16 tolerance (fp32 accumulation in different orders). Skipped
without PyTorch or enough GPUs."""

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: the DTensor styles are not tested here")

from multiprocess import run_ranks  # noqa: E402


def _close(got, ref, what):
    got, ref = got.float(), ref.float()
    tol = 2e-2 * ref.abs().max().item()
    err = (got - ref).abs().max().item()
    assert got.shape == ref.shape, f"{what}: shape {tuple(got.shape)}, expected {tuple(ref.shape)}"
    assert err <= tol, f"{what}: max abs error {err:.4g} > {tol:.4g}"


def _mlp(rank, world):
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import parallelize_module

    import asynctp.parallel as ap

    dev = torch.device("cuda", rank)

    def model():
        torch.manual_seed(0)
        m = nn.ModuleDict({"w1": nn.Linear(512, 1024), "w3": nn.Linear(512, 1024), "w2": nn.Linear(1024, 512)})
        return m.to(dev, torch.bfloat16)

    def forward(m, x):
        return m["w2"](nn.functional.silu(m["w1"](x)) * m["w3"](x))

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
        parallelize_module(par, mesh, {
            "w1": ap.ColwiseParallel(input_layouts=Shard(1), algorithm=algorithm),
            "w3": ap.ColwiseParallel(input_layouts=Shard(1), algorithm=algorithm),
            "w2": ap.RowwiseParallel(output_layouts=Shard(1), algorithm=algorithm),
        })
        rows = slice(rank * 256, (rank + 1) * 256)
        x_local = x[:, rows].clone().requires_grad_()
        y = forward(par, x_local)
        what = f"{algorithm}, {world} rank(s)"
        _close(y, y_ref[:, rows], f"{what}: output")
        (y.float() * upstream[:, rows].float()).sum().backward()
        _close(x_local.grad, x_ref.grad[:, rows], f"{what}: input gradient")
        for name, p in par.named_parameters():
            full = dict(ref.named_parameters())[name].grad
            shard = p.grad.full_tensor()
            _close(shard, full, f"{what}: {name} gradient")


@pytest.mark.parametrize("world", [1, 2])
def test_styles_match_one_gpu_pytorch_forward_and_backward(world):
    run_ranks(world, _mlp)
