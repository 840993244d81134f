"""The scaled (fp8) ops: asynctp.all_gather_scaled_matmul and asynctp.scaled_matmul_reduce_scatter, also
registered as torch.ops.asynctp.all_gather_scaled_matmul and torch.ops.asynctp.scaled_matmul_reduce_scatter.

out = (A * a_scale) @ (B * b_scale) + bias, with A and B in torch.float8_e4m3fn (one of them may be
torch.float8_e5m2), fp32 scales tensor-wise (one element) or row-wise (a_scale [rows, 1], b_scale
[1, N]), outputs in out_dtype (bf16, fp16, or float8_e4m3fn with tensor-wise scales, times
result_scale); the meaning of torch._scaled_mm and of PyTorch's fused_all_gather_scaled_matmul /
fused_scaled_matmul_reduce_scatter. The bias ([N], bf16 or the output's 16-bit dtype) and the result
scale (one fp32 element, fp8 outputs only) are optional; the reduce-scatter adds the bias to each
rank's product before the reduction, as reduce_scatter(torch._scaled_mm(a, b, bias=bias)) does. They run on the current CUDA
stream, with the algorithm asked for (auto by default; asynctp/scaled_ops.h). A fake implementation lets torch.compile
trace them; they have no autograd formula (fp8 training computes its gradients with ops of its own)."""

import ctypes

import torch

from . import _lib
from ._calls import _stream
from ._lib import Error
from ._shapes import _AllGatherShapes, _ReduceScatterShapes
from .comm import communicator, group_name
from .ops import _direct, _world

_DTYPES = {torch.float8_e4m3fn: _lib.DTYPE_FP8E4M3, torch.float8_e5m2: _lib.DTYPE_FP8E5M2,
           torch.float32: _lib.DTYPE_FP32, torch.bfloat16: _lib.DTYPE_BF16, torch.float16: _lib.DTYPE_FP16}


def _ref(t, op, name):
    code = _DTYPES.get(t.dtype)
    if code is None:
        raise Error(f"{op}: {name} is {t.dtype}; expected float8_e4m3fn or float8_e5m2 (A, B), float32 (scales), "
                    "bfloat16 or float16 (biases), bfloat16, float16 or float8_e4m3fn (outputs)")
    return _lib.Tensor.of(t.data_ptr(), code, t.shape, t.stride())


def _optional_refs(ts, op, name):
    """A C array of len(ts) tensors, NULL-data where None, or None where every one is None."""
    if all(t is None for t in ts):
        return None
    return (_lib.Tensor * len(ts))(*[_lib.Tensor() if t is None else _ref(t.contiguous(), op, f"{name}[{i}]")
                                     for i, t in enumerate(ts)])


def _col_major(b):
    """B [K, N] as the library takes it for fp8: [N, K] contiguous (no copy for W.t() of a contiguous W)."""
    return b.t() if b.t().is_contiguous() else b.t().contiguous()


def _options(algorithm):
    code = _lib.ALGORITHMS.get(algorithm)
    if code is None:
        raise Error(f"scaled op: algorithm is {algorithm!r}; expected one of " + ", ".join(_lib.ALGORITHMS))
    return _lib.options(code, _lib.COL_MAJOR, 0)


_AG_SCHEMA = ("(Tensor a_shard, Tensor[] bs, Tensor a_scale, Tensor[] b_scales, int gather_dim, str group_name, "
              "bool return_a, ScalarType out_dtype, bool use_fast_accum, str algorithm, Tensor?[] biases, "
              "Tensor?[] result_scales) -> (Tensor?, Tensor[])")
_RS_SCHEMA = ("(Tensor a, Tensor b, Tensor a_scale, Tensor b_scale, str reduce_op, int scatter_dim, str group_name, "
              "ScalarType out_dtype, bool use_fast_accum, str algorithm, Tensor? bias, Tensor? result_scale) -> Tensor")


def _all_gather_scaled_matmul_cuda(a_shard, bs, a_scale, b_scales, gather_dim, group_name, return_a, out_dtype,
                                   use_fast_accum, algorithm, biases, result_scales):
    op = "all_gather_scaled_matmul"
    comm = communicator(group_name)
    shapes = _AllGatherShapes(a_shard, gather_dim, comm.world_size)
    b_ops = [_col_major(b) for b in bs]
    outs = [torch.empty((shapes.rows, b.shape[1]), dtype=out_dtype, device=a_shard.device) for b in bs]
    a_full = shapes.a2.new_empty(shapes.rows, shapes.k) if return_a else None
    n = len(bs)
    b_refs = (_lib.Tensor * n)(*[_ref(b, op, f"bs[{i}]") for i, b in enumerate(b_ops)])
    s_refs = (_lib.Tensor * n)(*[_ref(s.contiguous(), op, f"b_scales[{i}]") for i, s in enumerate(b_scales)])
    out_refs = (_lib.Tensor * n)(*[_ref(o, op, f"outputs[{i}]") for i, o in enumerate(outs)])
    gathered = ctypes.byref(_ref(a_full, op, "gathered_a")) if a_full is not None else None
    a_ref, a_scale_ref = _ref(shapes.a2, op, "a_shard"), _ref(a_scale.contiguous(), op, "a_scale")
    bias_refs = _optional_refs(list(biases) or [None] * n, op, "biases")
    result_scale_refs = _optional_refs(list(result_scales) or [None] * n, op, "result_scales")
    options = _options(algorithm)
    _lib.call(op, comm.handle, ctypes.byref(a_ref), b_refs, n, ctypes.byref(a_scale_ref), s_refs,
              1 if shapes.along_k else 0, out_refs, gathered, _stream(a_shard), ctypes.byref(options),
              1 if use_fast_accum else 0, bias_refs, result_scale_refs)
    return (shapes.unflatten(a_full) if a_full is not None else None), [shapes.unflatten(o) for o in outs]


_all_gather_scaled_matmul = torch.library.custom_op("asynctp::all_gather_scaled_matmul", _all_gather_scaled_matmul_cuda,
                                                    mutates_args=(), device_types="cuda", schema=_AG_SCHEMA)


@_all_gather_scaled_matmul.register_fake
def _all_gather_scaled_matmul_fake(a_shard, bs, a_scale, b_scales, gather_dim, group_name, return_a, out_dtype,
                                   use_fast_accum, algorithm, biases, result_scales):
    shapes = _AllGatherShapes(a_shard, gather_dim, _world(group_name))
    a_full, outs = shapes.allocate(bs, return_a)
    outs = [o.new_empty(o.shape, dtype=out_dtype) for o in outs]
    return (shapes.unflatten(a_full) if a_full is not None else None), [shapes.unflatten(o) for o in outs]


def _scaled_matmul_reduce_scatter_cuda(a, b, a_scale, b_scale, reduce_op, scatter_dim, group_name, out_dtype,
                                       use_fast_accum, algorithm, bias, result_scale):
    op = "scaled_matmul_reduce_scatter"
    comm = communicator(group_name)
    if reduce_op not in _lib.REDUCE_OPS:
        raise Error(f"{op}: reduce_op is {reduce_op!r}; expected 'sum' or 'avg'")
    shapes = _ReduceScatterShapes(a, b, scatter_dim, comm.world_size)
    out = torch.empty(shapes.out_shape, dtype=out_dtype, device=a.device)
    refs = [_ref(shapes.a2, op, "a"), _ref(_col_major(b), op, "b"), _ref(a_scale.contiguous(), op, "a_scale"),
            _ref(b_scale.contiguous(), op, "b_scale"), _ref(out, op, "output")]
    extras = _optional_refs([bias, result_scale], op, "bias, result_scale")
    options = _options(algorithm)
    _lib.call(op, comm.handle, *[ctypes.byref(r) for r in refs[:4]], 1 if shapes.along_n else 0,
              _lib.REDUCE_OPS[reduce_op], ctypes.byref(refs[4]), _stream(a), ctypes.byref(options),
              1 if use_fast_accum else 0, *([None, None] if extras is None else
                                            [ctypes.byref(extras[0]), ctypes.byref(extras[1])]))
    return shapes.unflatten(out)


_scaled_matmul_reduce_scatter = torch.library.custom_op("asynctp::scaled_matmul_reduce_scatter",
                                                        _scaled_matmul_reduce_scatter_cuda, mutates_args=(),
                                                        device_types="cuda", schema=_RS_SCHEMA)


@_scaled_matmul_reduce_scatter.register_fake
def _scaled_matmul_reduce_scatter_fake(a, b, a_scale, b_scale, reduce_op, scatter_dim, group_name, out_dtype,
                                       use_fast_accum, algorithm, bias, result_scale):
    shapes = _ReduceScatterShapes(a, b, scatter_dim, _world(group_name))
    out = shapes.allocate()
    return shapes.unflatten(out.new_empty(out.shape, dtype=out_dtype))


def all_gather_scaled_matmul(a_shard, bs, a_scale, b_scales, gather_dim=0, group=None, return_a=True, *,
                             out_dtype=torch.bfloat16, use_fast_accum=False, algorithm="auto", biases=None,
                             result_scales=None):
    """All-gathers the fp8 `a_shard` along `gather_dim` and multiplies it, scaled, by each B.

    Returns (the gathered A or None, [(A * a_scale) @ (B_i * b_scales[i]) + biases[i] for each B]). A
    row-wise a_scale holds a_shard's rows ([rows, 1], gathered with them) or every row of the gathered
    A. biases and result_scales: None, or one per B (each None or a tensor)."""
    biases = list(biases) if biases is not None else [None] * len(bs)
    result_scales = list(result_scales) if result_scales is not None else [None] * len(bs)
    args = (a_shard, list(bs), a_scale, list(b_scales), gather_dim, group_name(group), return_a, out_dtype,
            use_fast_accum, algorithm, biases, result_scales)
    extras = [t for t in biases + result_scales if t is not None]
    if _direct(a_shard, a_scale, *args[1], *args[3], *extras):
        return _all_gather_scaled_matmul_cuda(*args)
    return torch.ops.asynctp.all_gather_scaled_matmul(*args)


def scaled_matmul_reduce_scatter(a, b, a_scale, b_scale, reduce_op="sum", scatter_dim=0, group=None, *,
                                 out_dtype=torch.bfloat16, use_fast_accum=False, algorithm="auto", bias=None,
                                 result_scale=None):
    """(a * a_scale) @ (b * b_scale) + bias, summed (or averaged) across ranks, this rank's slice along
    scatter_dim; an fp8 output is the sum times result_scale."""
    args = (a, b, a_scale, b_scale, reduce_op, scatter_dim, group_name(group), out_dtype, use_fast_accum, algorithm,
            bias, result_scale)
    if _direct(a, b, a_scale, b_scale, *[t for t in (bias, result_scale) if t is not None]):
        return _scaled_matmul_reduce_scatter_cuda(*args)
    return torch.ops.asynctp.scaled_matmul_reduce_scatter(*args)
