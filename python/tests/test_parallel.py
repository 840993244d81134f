"""asynctp.parallel's styles against torch's own, on meta tensors with a fake process group of 4 ranks (no
GPU): the same parameter sharding, the same output and gradient shapes and placements, and a forward
that runs asynctp's fused op in place of a separate collective. Their numbers on GPUs are checked by
test_parallel_gpu.py."""

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: the DTensor styles are not tested here")
dist = pytest.importorskip("torch.distributed")
pytest.importorskip("torch.distributed.tensor.parallel")

import asynctp  # noqa: E402
import asynctp.parallel as ap  # noqa: E402
import torch.distributed.tensor.parallel as tp  # noqa: E402
from torch import nn  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.tensor import DTensor, Replicate, Shard  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

WORLD = 4


@pytest.fixture(scope="module")
def mesh():
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=1, world_size=WORLD)
    yield init_device_mesh("cpu", (WORLD,))
    dist.destroy_process_group()


class Mlp(nn.Module):
    """A Llama MLP: silu(w1 x) * (w3 x), then w2."""

    def __init__(self, bias):
        super().__init__()
        self.w1 = nn.Linear(64, 128, bias=bias)
        self.w3 = nn.Linear(64, 128, bias=False)
        self.w2 = nn.Linear(128, 64, bias=bias)

    def forward(self, x):
        return self.w2(nn.functional.silu(self.w1(x)) * self.w3(x))


def plan(styles, seq_dim, use_local_output=True):
    return {
        "w1": styles.ColwiseParallel(input_layouts=Shard(seq_dim)),
        "w3": styles.ColwiseParallel(input_layouts=Shard(seq_dim)),
        "w2": styles.RowwiseParallel(output_layouts=Shard(seq_dim), use_local_output=use_local_output),
    }


def run(styles, mesh, local_shape, seq_dim, bias, use_local_output, device):
    """Forward and backward of the parallelized MLP: what comes out, and each parameter's layout."""
    model = Mlp(bias).to(torch.bfloat16).to(device)
    tp.parallelize_module(model, mesh, plan(styles, seq_dim, use_local_output))
    x = torch.randn(*local_shape, dtype=torch.bfloat16, device=device, requires_grad=True)
    y = model(x)
    (y.to_local() if isinstance(y, DTensor) else y).float().sum().backward()
    out = (type(y) is DTensor, tuple(y.placements) if isinstance(y, DTensor) else None, tuple(y.shape), y.dtype)
    params = {name: (p.placements, tuple(p.to_local().shape), p.grad.placements, tuple(p.grad.to_local().shape))
              for name, p in model.named_parameters()}
    return out, params, tuple(x.grad.shape)


@pytest.mark.parametrize("local_shape,seq_dim", [((2, 8, 64), 1), ((16, 64), 0)])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("use_local_output", [True, False])
def test_the_styles_shard_and_differentiate_like_torchs(mesh, local_shape, seq_dim, bias, use_local_output):
    # torch's styles on the CPU (the fake group moves no data; shapes and layouts are what is compared),
    # asynctp's on meta tensors (its ops' fake implementations).
    theirs = run(tp, mesh, local_shape, seq_dim, bias, use_local_output, "cpu")
    ours = run(ap, mesh, local_shape, seq_dim, bias, use_local_output, "meta")
    assert ours == theirs


class Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


def test_the_forward_runs_asynctps_fused_ops_and_no_collective_of_its_own(mesh):
    model = Mlp(bias=True).to(torch.bfloat16).to("meta")
    tp.parallelize_module(model, mesh, plan(ap, 1))
    x = torch.randn(2, 8, 64, dtype=torch.bfloat16, device="meta")
    with torch.no_grad(), Ops() as ops:
        model(x)
    assert ops.seen.count("asynctp.all_gather_matmul.default") == 2  # w1 and w3
    assert ops.seen.count("asynctp.matmul_reduce_scatter.default") == 1  # w2
    assert not [op for op in ops.seen if op.startswith("_c10d_functional.")], ops.seen


def test_layouts_without_a_sequence_shard_are_torchs_styles(mesh):
    model = Mlp(bias=True)
    tp.parallelize_module(model, mesh, {"w1": ap.ColwiseParallel(), "w2": ap.RowwiseParallel()})
    # torch's forward, with its hooks: no forward of asynctp's put on the modules.
    assert "forward" not in vars(model.w1) and "forward" not in vars(model.w2)
    assert model.w1.weight.placements == (Shard(0),) and model.w2.bias.placements == (Replicate(),)


def test_a_colwise_input_sharded_along_the_features_is_refused_by_name(mesh):
    model = nn.Linear(64, 128).to(torch.bfloat16).to("meta")
    tp.parallelize_module(model, mesh, ap.ColwiseParallel(input_layouts=Shard(-1)))
    with pytest.raises(asynctp.Error, match=r"input_layouts is S\(-1\), the features that nn.Linear contracts"):
        model(torch.randn(2, 8, 16, dtype=torch.bfloat16, device="meta"))
