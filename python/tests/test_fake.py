"""The ops' fake implementations (what torch.compile traces), on meta tensors with a fake process
group: no GPU needed. The shapes are checked against torch's own meaning of the arguments."""

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: the torch ops are not tested here")
dist = pytest.importorskip("torch.distributed")

import asynctp  # noqa: E402

WORLD = 4


@pytest.fixture(scope="module", autouse=True)
def fake_group():
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=1, world_size=WORLD)
    yield
    dist.destroy_process_group()


def meta(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, dtype=dtype, device="meta")


@pytest.mark.parametrize("gather_dim", [0, 1, 2, -1])
@pytest.mark.parametrize("return_a", [True, False])
def test_all_gather_matmul_shapes_follow_torch(gather_dim, return_a):
    a = meta(3, 5, 64)
    w1, w2 = meta(48, 64), meta(16, 64)  # nn.Linear weights: B = W.t()
    a_full, outs = asynctp.all_gather_matmul(a, [w1.t(), w2.t()], gather_dim, return_a=return_a)
    gathered = list(a.shape)
    gathered[gather_dim] *= WORLD
    if return_a:
        assert list(a_full.shape) == gathered
    else:
        assert a_full is None
    assert [list(o.shape) for o in outs] == [gathered[:-1] + [48], gathered[:-1] + [16]]
    assert all(o.dtype == torch.bfloat16 for o in outs)


@pytest.mark.parametrize("scatter_dim", [0, 1, 2, -1])
@pytest.mark.parametrize("reduce_op", ["sum", "avg"])
def test_matmul_reduce_scatter_shapes_follow_torch(scatter_dim, reduce_op):
    a = meta(8, 4, 64, dtype=torch.float16)
    b = meta(64, 32, dtype=torch.float16)
    out = asynctp.matmul_reduce_scatter(a, b, reduce_op, scatter_dim)
    expected = [8, 4, 32]
    expected[scatter_dim] //= WORLD
    assert list(out.shape) == expected and out.dtype == torch.float16


def test_results_are_laid_out_like_torchs_fused_op():
    # Gathering along a middle dim: the rows are gathered rank-major, then moved back, as torch does
    # (its results are views with these strides; ours must match for needs_fixed_stride_order callers).
    a_full, (out,) = asynctp.all_gather_matmul(meta(3, 5, 64), [meta(64, 32)], 1)
    assert a_full.stride() == (64, 3 * 64, 1)
    assert out.stride() == (32, 3 * 32, 1)


def test_bad_arguments_name_what_was_expected():
    with pytest.raises(asynctp.Error, match=r"gather_dim is 3; expected a dim of a 3-dim tensor"):
        asynctp.all_gather_matmul(meta(3, 5, 64), [meta(64, 32)], 3)
    with pytest.raises(asynctp.Error, match=r"a has 1 dims; expected at least 2"):
        asynctp.matmul_reduce_scatter(meta(64), meta(64, 32), "sum", 0)
    with pytest.raises(asynctp.Error, match=r"a.shape\[0\] is 6; it must divide by the world size 4"):
        asynctp.matmul_reduce_scatter(meta(6, 64), meta(64, 32), "sum", 0)
    with pytest.raises(asynctp.Error, match=r"b.shape\[1\] \(N\) is 30; .* must divide by the world size 4"):
        asynctp.matmul_reduce_scatter(meta(8, 64), meta(64, 30), "sum", -1)


def test_make_fx_traces_both_ops_with_symbolic_shapes():
    from torch.fx.experimental.proxy_tensor import make_fx

    def mlp(x, w_up, w_down):
        _, (h,) = asynctp.all_gather_matmul(x, [w_up.t()], 0, return_a=False)
        return asynctp.matmul_reduce_scatter(torch.relu(h), w_down.t(), "sum", 0)

    gm = make_fx(mlp, tracing_mode="symbolic")(meta(16, 64), meta(128, 64), meta(64, 128))
    targets = {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}
    assert "asynctp.all_gather_matmul.default" in targets
    assert "asynctp.matmul_reduce_scatter.default" in targets


@pytest.mark.parametrize("gather_dim", [0, -1])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16])
def test_all_gather_scaled_matmul_shapes_and_dtypes(gather_dim, out_dtype):
    a = meta(32, 64, dtype=torch.float8_e4m3fn)
    w = meta(48, 64 * (WORLD if gather_dim == -1 else 1), dtype=torch.float8_e4m3fn)
    a_full, (out,) = asynctp.all_gather_scaled_matmul(a, [w.t()], meta(1, dtype=torch.float32),
                                                      [meta(1, dtype=torch.float32)], gather_dim, out_dtype=out_dtype)
    gathered = [32 * WORLD, 64] if gather_dim == 0 else [32, 64 * WORLD]
    assert list(a_full.shape) == gathered and a_full.dtype == torch.float8_e4m3fn
    assert list(out.shape) == [gathered[0], 48] and out.dtype == out_dtype


def test_scaled_ops_with_a_bias_and_an_fp8_output():
    a = meta(32, 64, dtype=torch.float8_e4m3fn)
    w = meta(48, 64, dtype=torch.float8_e4m3fn)
    one = meta(1, dtype=torch.float32)
    _, (out,) = asynctp.all_gather_scaled_matmul(a, [w.t()], one, [one], 0, out_dtype=torch.float8_e4m3fn,
                                                 biases=[meta(48, dtype=torch.bfloat16)], result_scales=[one])
    assert list(out.shape) == [32 * WORLD, 48] and out.dtype == torch.float8_e4m3fn
    out = asynctp.scaled_matmul_reduce_scatter(meta(64, 32, dtype=torch.float8_e4m3fn),
                                               meta(128, 32, dtype=torch.float8_e4m3fn).t(), one, one, "sum", 0,
                                               out_dtype=torch.float8_e4m3fn, bias=meta(128, dtype=torch.bfloat16),
                                               result_scale=one)
    assert list(out.shape) == [64 // WORLD, 128] and out.dtype == torch.float8_e4m3fn


@pytest.mark.parametrize("scatter_dim", [0, -1])
def test_scaled_matmul_reduce_scatter_shapes_and_dtypes(scatter_dim):
    a = meta(64, 32, dtype=torch.float8_e4m3fn)
    w = meta(128, 32, dtype=torch.float8_e4m3fn)
    out = asynctp.scaled_matmul_reduce_scatter(a, w.t(), meta(64, 1, dtype=torch.float32),
                                               meta(1, 128, dtype=torch.float32), "sum", scatter_dim,
                                               out_dtype=torch.float16)
    expected = [64, 128]
    expected[scatter_dim] //= WORLD
    assert list(out.shape) == expected and out.dtype == torch.float16
