"""The scaled (fp8) ops on real GPUs, one process per rank, against a reference computed by torch from
the whole fp8 inputs read back as fp32 and scaled by hand: sequential and pipelined over every scaling,
output dtype and dim, fused where its kernel takes the call, and biases and fp8 outputs with a result
scale under every algorithm. Skipped, saying why, without PyTorch or
without enough GPUs."""

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: the scaled ops are not tested here")

import asynctp  # noqa: E402
from multiprocess import run_ranks, run_threads  # noqa: E402

FP8 = torch.float8_e4m3fn


def _fp8(seed, *shape):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * 2).to(FP8)


def _scales(seed, *shape):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(*shape, generator=g) + 0.5


def _assert_close(got, ref, what):
    # One rounding to the output's dtype (fp8 e4m3 keeps 3 bits: 2^-4 relative), with room to spare.
    unit = {torch.bfloat16: 1.5e-2, torch.float16: 4e-3, FP8: 8e-2}[got.dtype]
    tol = unit * ref.abs().max().item()
    err = (got.float().cpu() - ref).abs().max().item()
    assert got.shape == ref.shape, f"{what}: shape {tuple(got.shape)}, expected {tuple(ref.shape)}"
    assert err <= tol, f"{what}: max abs error {err:.4g} > {tol:.4g}"


def _cases(rank, world):
    for algorithm in ("sequential", "pipelined"):
        _algorithm_cases(rank, world, algorithm)
    _fused_kernel_cases(rank, world)
    for algorithm in ("sequential", "pipelined", "fused"):
        _epilogue_cases(rank, world, algorithm)
    _epilogue_cases(rank, world, "fused", use_fast_accum=True)  # the fused kernel's (the all-gather's)


def _epilogue_cases(rank, world, algorithm, use_fast_accum=False):
    """A bias (bf16, large beside the products so that an fp8 output's tolerance sees one left out) and
    an fp8 output with its result scale, tensor-wise scales; the reduce-scatter adds the bias to every
    rank's product before the sum."""
    dev = torch.device("cuda", torch.cuda.current_device())
    m, k, n = 64, 128, 96
    g = torch.Generator().manual_seed(200)
    bias = ((torch.randint(8, 16, (n,), generator=g) * (torch.randint(0, 2, (n,), generator=g) * 2 - 1)).float()
            .to(torch.bfloat16))
    result_scale = torch.tensor([0.5])
    sa, sb = _scales(210, 1), _scales(211, 1)
    shards = [_fp8(220 + r, m, k) for r in range(world)]
    w = _fp8(230, n, k)
    product = torch.cat([s.float() for s in shards]) * sa @ (w.float().t() * sb) + bias.float()
    for out_dtype, scale in ((torch.bfloat16, None), (FP8, result_scale), (FP8, None)):
        what = f"{algorithm} all_gather_scaled_matmul with a bias, out {out_dtype}, result scale {scale}"
        _, (out,) = asynctp.all_gather_scaled_matmul(
            shards[rank].to(dev), [w.to(dev).t()], sa.to(dev), [sb.to(dev)], 0, out_dtype=out_dtype, algorithm=algorithm,
            biases=[bias.to(dev)], result_scales=[scale.to(dev) if scale is not None else None],
            use_fast_accum=use_fast_accum)
        assert out.dtype == out_dtype, what
        _assert_close(out, product * (scale.item() if scale is not None else 1.0), what)
    a_parts = [_fp8(240 + r, world * m, k) for r in range(world)]
    w_parts = [_fp8(250 + r, n, k) for r in range(world)]
    for out_dtype in (torch.bfloat16, FP8):
        for reduce_op in ("sum", "avg"):
            what = f"{algorithm} scaled_matmul_reduce_scatter {reduce_op} with a bias, out {out_dtype}"
            scale = result_scale if out_dtype == FP8 else None
            out = asynctp.scaled_matmul_reduce_scatter(
                a_parts[rank].to(dev), w_parts[rank].to(dev).t(), sa.to(dev), sb.to(dev), reduce_op, 0,
                out_dtype=out_dtype, algorithm=algorithm, bias=bias.to(dev),
                result_scale=scale.to(dev) if scale is not None else None, use_fast_accum=use_fast_accum)
            full = sum((a.float() * sa) @ (wp.float().t() * sb) + bias.float() for a, wp in zip(a_parts, w_parts))
            full = full / (world if reduce_op == "avg" else 1) * (scale.item() if scale is not None else 1.0)
            _assert_close(out, full.chunk(world, dim=0)[rank], what)


def _fused_kernel_cases(rank, world):
    """What the fused kernel's fp8 form takes (e4m3, fast accumulation, bf16 or fp16 out): the all-gather
    with tensor-wise and row-wise scales, the reduce-scatter (256 rows a rank) with each rank's own
    tensor-wise and row-wise scales, each with and without a bias (of the output's dtype)."""
    dev = torch.device("cuda", torch.cuda.current_device())
    m, k, n = 64, 128, 96
    shards = [_fp8(110 + r, m, k) for r in range(world)]
    w = _fp8(120, n, k)
    bias_values = (torch.arange(n) % 13 - 6) * 0.5
    bf16, fp16 = torch.bfloat16, torch.float16
    for rowwise, with_bias, out_dtype in ((False, False, bf16), (True, False, bf16), (False, True, bf16),
                                          (True, True, bf16), (False, True, fp16), (True, False, fp16)):
        bias = bias_values.to(out_dtype)
        a_scales = [_scales(130 + r, m, 1) if rowwise else _scales(130, 1) for r in range(world)]
        b_scale = _scales(140, 1, n) if rowwise else _scales(141, 1)
        what = (f"fused all_gather_scaled_matmul {'row-wise' if rowwise else 'tensor-wise'}, fast accumulation"
                f"{', a bias' if with_bias else ''}, {out_dtype}")
        _, (out,) = asynctp.all_gather_scaled_matmul(
            shards[rank].to(dev), [w.to(dev).t()], a_scales[rank].to(dev), [b_scale.to(dev)], 0, use_fast_accum=True,
            algorithm="fused", biases=[bias.to(dev)] if with_bias else None, out_dtype=out_dtype)
        assert out.dtype == out_dtype, what
        a_ref = torch.cat([s.float() * sc for s, sc in zip(shards, a_scales)])
        _assert_close(out, a_ref @ (w.float().t() * b_scale) + (bias.float() if with_bias else 0), what)
    rows = 256 * world
    a_parts = [_fp8(150 + r, rows, k) for r in range(world)]
    w_parts = [_fp8(160 + r, n, k) for r in range(world)]
    for rowwise, reduce_op, with_bias, out_dtype in (
            (False, "sum", False, bf16), (False, "avg", False, bf16), (True, "sum", False, bf16), (True, "avg", False, bf16),
            (False, "sum", True, bf16), (True, "avg", True, bf16), (False, "avg", True, fp16), (True, "sum", False, fp16)):
        bias = bias_values.to(out_dtype)
        a_scales = [_scales(170 + r, rows, 1) if rowwise else _scales(170 + r, 1) for r in range(world)]
        b_scales = [_scales(180 + r, 1, n) if rowwise else _scales(180 + r, 1) for r in range(world)]
        kind = "row-wise" if rowwise else "tensor-wise"
        what = (f"fused scaled_matmul_reduce_scatter {reduce_op}, each rank's own {kind} scales, fast accumulation"
                f"{', a bias' if with_bias else ''}, {out_dtype}")
        out = asynctp.scaled_matmul_reduce_scatter(a_parts[rank].to(dev), w_parts[rank].to(dev).t(), a_scales[rank].to(dev),
                                                   b_scales[rank].to(dev), reduce_op, 0, use_fast_accum=True,
                                                   algorithm="fused", bias=bias.to(dev) if with_bias else None,
                                                   out_dtype=out_dtype)
        assert out.dtype == out_dtype, what
        full = sum((a.float() * sa) @ (wp.float().t() * sb) + (bias.float() if with_bias else 0)
                   for a, wp, sa, sb in zip(a_parts, w_parts, a_scales, b_scales))
        if reduce_op == "avg":
            full = full / world
        _assert_close(out, full.chunk(world, dim=0)[rank], what)


def _algorithm_cases(rank, world, algorithm):
    dev = torch.device("cuda", torch.cuda.current_device())  # GPU 0 where the ranks are threads
    m, k, n = 64, 128, 96
    shards = [_fp8(10 + r, m, k) for r in range(world)]
    w = _fp8(20, n, k)  # an nn.Linear weight [N, K]: B = w.t(), column-major as fp8 needs
    for rowwise in (False, True):
        a_scales = [_scales(30 + r, m, 1) if rowwise else _scales(30, 1) for r in range(world)]
        b_scale = _scales(40, 1, n) if rowwise else _scales(41, 1)
        for out_dtype in (torch.bfloat16, torch.float16):
            what = f"{algorithm} all_gather_scaled_matmul {'row-wise' if rowwise else 'tensor-wise'} {out_dtype}"
            a_full, (out,) = asynctp.all_gather_scaled_matmul(
                shards[rank].to(dev), [w.to(dev).t()], a_scales[rank].to(dev), [b_scale.to(dev)], 0, out_dtype=out_dtype,
                algorithm=algorithm)
            a_ref = torch.cat([s.float() * sc for s, sc in zip(shards, a_scales)])
            _assert_close(out, a_ref @ (w.float().t() * b_scale), what)
            assert torch.equal(a_full.cpu().view(torch.uint8), torch.cat(shards).view(torch.uint8)), what + ": gathered A"
    # Reduce-scatter: rank r holds A's columns and B's rows [r*k, (r+1)*k); the same scales on every rank.
    a_parts = [_fp8(50 + r, world * m, k) for r in range(world)]
    w_parts = [_fp8(60 + r, n * world, k) for r in range(world)]
    for rowwise in (False, True):
        sa = _scales(70, world * m, 1) if rowwise else _scales(71, 1)
        sb = _scales(72, 1, n * world) if rowwise else _scales(73, 1)
        for scatter_dim in (0, -1):
            what = f"{algorithm} scaled_matmul_reduce_scatter {'row-wise' if rowwise else 'tensor-wise'} scatter_dim {scatter_dim}"
            out = asynctp.scaled_matmul_reduce_scatter(a_parts[rank].to(dev), w_parts[rank].to(dev).t(), sa.to(dev),
                                                       sb.to(dev), "sum", scatter_dim, algorithm=algorithm)
            full = sum((a.float() * sa) @ (wp.float().t() * sb) for a, wp in zip(a_parts, w_parts))
            ref = full.chunk(world, dim=scatter_dim)[rank]
            _assert_close(out, ref, what)


def test_scaled_ops_on_one_rank():
    run_ranks(1, _cases)


def test_scaled_ops_on_two_ranks():
    run_ranks(2, _cases)


@pytest.mark.parametrize("world", [2, 4])
def test_scaled_ops_with_the_ranks_as_threads(world):
    run_threads(world, _cases)
