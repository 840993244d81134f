"""asynctp.inductor's rewrite against PyTorch's own micro-pipeline TP pass: the graphs come from make_fx
over functional collectives and matmuls, inductor's pass fuses them into torch.ops.symm_mem's ops (with a
fake process group of 4 ranks and PyTorch's symmetric-memory test mode: no GPU), then the rewrite must
put asynctp's ops in their place with the same arguments, and the graph must still produce outputs of the
same shapes and strides. The compiled op's results on GPUs are checked by test_ops_gpu.py."""

import logging

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: the torch.compile pass is not tested here")
dist = pytest.importorskip("torch.distributed")

import asynctp  # noqa: E402

inductor = pytest.importorskip("asynctp.inductor", reason="asynctp.inductor needs torch._inductor")

if asynctp.inductor._torch_release() not in asynctp.inductor.TESTED_TORCH:
    pytest.skip(f"PyTorch {torch.__version__} is not one the pass is tested with", allow_module_level=True)

import torch.distributed._functional_collectives as funcol  # noqa: E402
from torch._inductor.decomposition import select_decomp_table  # noqa: E402
from torch._inductor.fx_passes.micro_pipeline_tp import micro_pipeline_tp_pass  # noqa: E402
from torch._inductor.fx_passes.post_grad import view_to_reshape  # noqa: E402
from torch.distributed._symmetric_memory import _test_mode  # noqa: E402
from torch.fx.experimental.proxy_tensor import make_fx  # noqa: E402
from torch.fx.passes.fake_tensor_prop import FakeTensorProp  # noqa: E402

WORLD = 4
BF16 = torch.bfloat16


@pytest.fixture(scope="module", autouse=True)
def fake_group():
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=1, world_size=WORLD)
    yield
    dist.destroy_process_group()


def group():
    return dist.group.WORLD.group_name


def rand(*shape, dtype=BF16):
    return torch.randn(*shape).to(dtype)


# --- the programs inductor's pass fuses, one per variant ------------------------------------------------

def ag_rows(x, w):  # gather along dim 0, B as given
    return torch.matmul(funcol.all_gather_tensor(x, 0, group()), w)


def ag_two_linears(x, w1, w2):  # two nn.Linear weights: B transposed
    a = funcol.all_gather_tensor(x, 0, group())
    return torch.matmul(a, w1.t()), torch.matmul(a, w2.t())


def ag_sequence(x, w):  # [batch, sequence, hidden] gathered along the sequence
    return torch.matmul(funcol.all_gather_tensor(x, 1, group()), w.t())


def ag_last(x, w):  # K sharded: gathered along the last dim
    return torch.matmul(funcol.all_gather_tensor(x, x.dim() - 1, group()), w)


def ag_keeps_a(x, w):  # the gathered A is used too: return_A stays True
    a = funcol.all_gather_tensor(x, 0, group())
    return a, torch.matmul(a, w)


def rs_rows(a, w):
    return funcol.reduce_scatter_tensor(torch.matmul(a, w.t()), "sum", 0, group())


def rs_sequence(a, w):
    return funcol.reduce_scatter_tensor(torch.matmul(a, w.t()), "sum", 1, group())


def rs_last(a, w):
    return funcol.reduce_scatter_tensor(torch.matmul(a, w), "avg", a.dim() - 1, group())


CASES = {
    "ag rows": (ag_rows, lambda: (rand(16, 64), rand(64, 32)), dict(gather_dim=0, bs=1)),
    "ag two linears": (ag_two_linears, lambda: (rand(16, 64), rand(48, 64), rand(16, 64)),
                       dict(gather_dim=0, bs=2)),
    "ag sequence": (ag_sequence, lambda: (rand(2, 8, 64), rand(32, 64)), dict(gather_dim=1, bs=1)),
    "ag last": (ag_last, lambda: (rand(16, 1024), rand(4096, 32)), dict(gather_dim=1, bs=1)),
    "ag keeps a": (ag_keeps_a, lambda: (rand(16, 64), rand(64, 32)), dict(gather_dim=0, bs=1)),
    "rs rows": (rs_rows, lambda: (rand(64, 128), rand(32, 128)), dict(scatter_dim=0, reduce_op="sum")),
    "rs sequence": (rs_sequence, lambda: (rand(2, 16, 128), rand(32, 128)), dict(scatter_dim=1, reduce_op="sum")),
    "rs last": (rs_last, lambda: (rand(16, 128), rand(128, 64)), dict(scatter_dim=1, reduce_op="avg")),
}


def fused_by_torch(fn, args):
    """fn traced as inductor traces it (its decompositions, then views as reshapes), and fused by
    inductor's micro-pipeline TP pass."""
    # Without inductor's CPU decomposition of small matmuls (the graphs here are traced on the CPU; on a
    # GPU, where the pass runs, matmuls stay aten.mm).
    table = {op: f for op, f in select_decomp_table().items() if op is not torch.ops.aten.mm.default}
    gm = make_fx(fn, decomposition_table=table, tracing_mode="fake")(*args)
    view_to_reshape(gm)
    with _test_mode():
        micro_pipeline_tp_pass(gm.graph)
    gm.recompile()
    return gm


def calls(gm, namespace):
    return [n for n in gm.graph.nodes if n.op == "call_function" and str(n.target).startswith(namespace + ".")]


def outputs(gm, args):
    """The shapes and strides of gm's outputs, by fake-tensor propagation."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode()
    fake_args = [mode.from_tensor(a) for a in args]
    out = FakeTensorProp(gm, mode).propagate(*fake_args)
    flat = out if isinstance(out, (tuple, list)) else [out]
    return [(tuple(t.shape), t.stride(), t.dtype) for t in flat]


@pytest.mark.parametrize("name", list(CASES))
def test_every_fused_op_inductor_emits_becomes_asynctps(name):
    fn, make_args, expected = CASES[name]
    args = make_args()
    gm = fused_by_torch(fn, args)
    torch_nodes = calls(gm, "symm_mem")
    assert len(torch_nodes) == 1, f"inductor's pass did not fuse {name}: {[str(n.target) for n in gm.graph.nodes]}"
    before = outputs(gm, args)
    torch_args = inductor._arguments(torch_nodes[0])

    assert inductor.rewrite(gm.graph, algorithm="fused", chunks_per_rank=2) == 1
    gm.recompile()
    assert calls(gm, "symm_mem") == []
    (node,) = calls(gm, "asynctp")
    if "gather_dim" in expected:
        assert node.target is torch.ops.asynctp.all_gather_matmul.default
        a, bs, gather_dim, group_name, return_a, algorithm, chunks = node.args
        assert (gather_dim, len(bs)) == (expected["gather_dim"], expected["bs"])
        assert (a, bs, return_a) == (torch_args["A"], torch_args["Bs"], torch_args.get("return_A", True))
    else:
        assert node.target is torch.ops.asynctp.matmul_reduce_scatter.default
        a, b, reduce_op, scatter_dim, group_name, algorithm, chunks = node.args
        assert (reduce_op, scatter_dim) == (expected["reduce_op"], expected["scatter_dim"])
        assert (a, b) == (torch_args["A"], torch_args["B"])
    assert (group_name, algorithm, chunks) == (group(), "fused", 2)
    # The graph's outputs keep their shapes and dtypes; the node carries what asynctp's op returns.
    after = outputs(gm, args)
    assert [(shape, dtype) for shape, _, dtype in after] == [(shape, dtype) for shape, _, dtype in before]
    fake = node.meta["val"]
    fake_out = fake[1][0] if isinstance(fake, (tuple, list)) else fake
    assert fake_out.dtype == BF16


def test_fp32_stays_with_pytorch_and_says_why(caplog):
    args = (rand(16, 64, dtype=torch.float32), rand(64, 32, dtype=torch.float32))
    gm = fused_by_torch(ag_rows, args)
    with caplog.at_level(logging.WARNING, logger="asynctp.inductor"):
        assert inductor.rewrite(gm.graph) == 0
    assert len(calls(gm, "symm_mem")) == 1
    assert "A is torch.float32; asynctp's ops take torch.bfloat16 and torch.float16" in caplog.text


class Marker(torch._inductor.custom_graph_pass.CustomGraphPass):
    def __init__(self):
        self.seen = 0

    def __call__(self, graph):
        self.seen += 1

    def uuid(self):
        return "marker"


def test_enable_installs_the_pass_after_torchs_and_keeps_the_one_before():
    config = torch._inductor.config
    previous = Marker()
    config.post_grad_custom_post_pass = previous
    try:
        with _test_mode():
            inductor.enable_async_tp(group(), algorithm="pipelined")
        installed = config.post_grad_custom_post_pass
        assert config._micro_pipeline_tp is True
        assert isinstance(installed, inductor.AsyncTpPass) and installed.previous is previous
        assert installed.uuid() == ("asynctp.inductor", inductor._REWRITE_VERSION, "pipelined", 0, "marker")

        args = (rand(16, 64), rand(64, 32))
        gm = fused_by_torch(ag_rows, args)
        installed(gm.graph)  # as inductor calls it
        assert previous.seen == 1 and len(calls(gm, "asynctp")) == 1

        inductor.disable_async_tp()
        assert config.post_grad_custom_post_pass is previous and config._micro_pipeline_tp is False
    finally:
        config.post_grad_custom_post_pass = None
        config._micro_pipeline_tp = False


def test_a_pytorch_it_is_not_tested_with_is_refused(monkeypatch):
    monkeypatch.setattr(torch, "__version__", "2.9.1+cu128")
    with pytest.raises(asynctp.Error, match=r"PyTorch 2.9.1\+cu128 is not a version .* tested with \(expected 2.11\)"):
        inductor.enable_async_tp(group())
    assert not isinstance(torch._inductor.config.post_grad_custom_post_pass, inductor.AsyncTpPass)


# --- the scaled (fp8) forms --------------------------------------------------------------------------

FP8 = torch.float8_e4m3fn


def ag_scaled_rows(x, w, sa, sb):  # row-wise scales: A's are gathered beside A
    a = funcol.all_gather_tensor(x, 0, group())
    return torch._scaled_mm(a, w.t(), funcol.all_gather_tensor(sa, 0, group()), sb, out_dtype=BF16)


def ag_scaled_tensorwise(x, w, sa, sb):
    return torch._scaled_mm(funcol.all_gather_tensor(x, 0, group()), w.t(), sa, sb, out_dtype=torch.float16)


def rs_scaled(a, w, sa, sb):
    return funcol.reduce_scatter_tensor(torch._scaled_mm(a, w.t(), sa, sb, out_dtype=BF16), "sum", 0, group())


def ag_scaled_bias(x, w, sa, sb, bias):
    return torch._scaled_mm(funcol.all_gather_tensor(x, 0, group()), w.t(), sa, sb, bias=bias, out_dtype=BF16)


def ag_scaled_fp8(x, w, sa, sb, sr):
    return torch._scaled_mm(funcol.all_gather_tensor(x, 0, group()), w.t(), sa, sb, scale_result=sr, out_dtype=FP8)


def rs_scaled_bias_fp8(a, w, sa, sb, bias, sr):
    y = torch._scaled_mm(a, w.t(), sa, sb, bias=bias, scale_result=sr, out_dtype=FP8)
    return funcol.reduce_scatter_tensor(y, "sum", 0, group())


SCALED_CASES = {
    "ag scaled row-wise": (ag_scaled_rows, lambda: (rand(16, 64, dtype=FP8), rand(32, 64, dtype=FP8), torch.rand(16, 1),
                                                    torch.rand(1, 32)), BF16),
    "ag scaled tensor-wise": (ag_scaled_tensorwise, lambda: (rand(16, 64, dtype=FP8), rand(32, 64, dtype=FP8),
                                                             torch.tensor(0.5), torch.tensor(2.0)), torch.float16),
    "rs scaled": (rs_scaled, lambda: (rand(64, 128, dtype=FP8), rand(32, 128, dtype=FP8), torch.tensor(0.5),
                                      torch.tensor(2.0)), BF16),
    "ag scaled bias": (ag_scaled_bias, lambda: (rand(16, 64, dtype=FP8), rand(32, 64, dtype=FP8), torch.tensor(0.5),
                                                torch.tensor(2.0), rand(32)), BF16),
    "rs scaled bias fp8": (rs_scaled_bias_fp8, lambda: (rand(64, 128, dtype=FP8), rand(32, 128, dtype=FP8),
                                                        torch.tensor(0.5), torch.tensor(2.0), rand(32),
                                                        torch.tensor(0.25)), FP8),
}


@pytest.mark.parametrize("name", list(SCALED_CASES))
def test_every_scaled_fused_op_becomes_asynctps(name):
    fn, make_args, out_dtype = SCALED_CASES[name]
    args = make_args()
    gm = fused_by_torch(fn, args)
    (torch_node,) = calls(gm, "symm_mem")
    before = outputs(gm, args)
    torch_args = inductor._arguments(torch_node)

    assert inductor.rewrite(gm.graph, algorithm="sequential") == 1
    gm.recompile()
    assert calls(gm, "symm_mem") == []
    (node,) = calls(gm, "asynctp")
    if name.startswith("ag"):
        assert node.target is torch.ops.asynctp.all_gather_scaled_matmul.default
        a, bs, a_scale, b_scales, gather_dim, _, return_a, dtype, fast, algorithm, biases, result_scales = node.args
        assert (a, bs, a_scale, b_scales) == (torch_args["A"], torch_args["Bs"], torch_args["A_scale"],
                                              torch_args["B_scales"])
        assert (gather_dim, return_a) == (torch_args["gather_dim"], True)
        assert (biases, result_scales) == (list(torch_args["biases"]), list(torch_args["result_scales"]))
        bias = biases[0]
    else:
        assert node.target is torch.ops.asynctp.scaled_matmul_reduce_scatter.default
        a, b, a_scale, b_scale, reduce_op, scatter_dim, _, dtype, fast, algorithm, bias, result_scale = node.args
        assert (a, b, a_scale, b_scale) == (torch_args["A"], torch_args["B"], torch_args["A_scale"], torch_args["B_scale"])
        assert (bias, result_scale) == (torch_args.get("bias"), torch_args.get("result_scale"))
        assert (reduce_op, scatter_dim) == ("sum", 0)
    assert (dtype, fast, algorithm) == (out_dtype, False, "sequential")
    assert (bias is not None) == ("bias" in name)
    after = outputs(gm, args)
    assert [(shape, d) for shape, _, d in after] == [(shape, d) for shape, _, d in before]


def test_an_all_gather_scaled_op_with_an_fp8_result_and_its_scale_becomes_asynctps():
    # PyTorch's own fake implementation of this op fails on an fp8 out_dtype (torch 2.11), so only the
    # rewrite's arguments are compared here.
    gm = fused_by_torch(ag_scaled_fp8, (rand(16, 64, dtype=FP8), rand(32, 64, dtype=FP8), torch.tensor(0.5),
                                        torch.tensor(2.0), torch.tensor(0.25)))
    (torch_node,) = calls(gm, "symm_mem")
    torch_args = inductor._arguments(torch_node)
    assert inductor.rewrite(gm.graph) == 1
    (node,) = calls(gm, "asynctp")
    assert node.target is torch.ops.asynctp.all_gather_scaled_matmul.default
    assert node.args[7] == FP8
    assert node.args[11] == list(torch_args["result_scales"]) and node.args[11][0] is not None


def test_a_scaled_op_with_an_e5m2_result_stays_with_pytorch_and_says_why(caplog):
    def e5m2_out(x, w, sa, sb):
        return torch._scaled_mm(funcol.all_gather_tensor(x, 0, group()), w.t(), sa, sb, out_dtype=torch.float8_e5m2)

    gm = fused_by_torch(e5m2_out, (rand(16, 64, dtype=FP8), rand(32, 64, dtype=FP8), torch.tensor(1.0), torch.tensor(1.0)))
    with caplog.at_level(logging.WARNING, logger="asynctp.inductor"):
        assert inductor.rewrite(gm.graph) == 0
    assert len(calls(gm, "symm_mem")) == 1
    assert "asynctp's scaled ops give one of bf16, fp16 or fp8 e4m3" in caplog.text
