"""asynctp's ops as PyTorch custom ops: torch.ops.asynctp.all_gather_matmul and
torch.ops.asynctp.matmul_reduce_scatter.

Arguments and results mean what they mean for torch.ops.symm_mem.fused_all_gather_matmul and
fused_matmul_reduce_scatter. Each op runs on the current CUDA stream; a fake implementation (shapes
and strides only, computed by the same code as the real one) lets torch.compile trace it, and an
autograd formula makes it differentiable: the backward of each op is the other op (docs/reference/python_api.md)."""

import contextlib
import ctypes

import torch
import torch.distributed._functional_collectives as funcol
import torch.distributed.distributed_c10d as c10d

from . import _lib
from .comm import communicator, group_name
from ._lib import Error

_DTYPES = {torch.bfloat16: _lib.DTYPE_BF16, torch.float16: _lib.DTYPE_FP16, torch.float32: _lib.DTYPE_FP32}


def _ref(t, op, name):
    code = _DTYPES.get(t.dtype)
    if code is None:
        raise Error(f"{op}: {name} is {t.dtype}; expected torch.bfloat16 or torch.float16")
    return _lib.Tensor.of(t.data_ptr(), code, t.shape, t.stride())


def _dim(dim, ndim, op, name):
    d = dim + ndim if dim < 0 else dim
    if not 0 <= d < ndim:
        raise Error(f"{op}: {name} is {dim}; expected a dim of a {ndim}-dim tensor (-{ndim} to {ndim - 1})")
    return d


def _options(op, algorithm, chunks_per_rank, b_layout):
    code = _lib.ALGORITHMS.get(algorithm)
    if code is None:
        raise Error(f"{op}: algorithm is {algorithm!r}; expected one of " + ", ".join(_lib.ALGORITHMS))
    return _lib.options(code, b_layout, chunks_per_rank)


def _b_operands(bs, op, name):
    """(layout, the [K, N] or [N, K] tensors passed to asynctp). B = W.t() of a contiguous nn.Linear
    weight W goes as W, column-major, without a copy; a B that is neither layout is copied."""
    for i, b in enumerate(bs):
        if b.dim() != 2:
            raise Error(f"{op}: {name}[{i}] has {b.dim()} dims; expected 2 ([K, N])")
    col = not bs[0].is_contiguous() and bs[0].t().is_contiguous()
    if col:
        return _lib.COL_MAJOR, [b.t().contiguous() for b in bs]
    return _lib.ROW_MAJOR, [b.contiguous() for b in bs]


try:
    _raw_stream = torch._C._cuda_getCurrentRawStream  # the handle alone, without making a Stream object
except AttributeError:
    def _raw_stream(index):
        return torch.cuda.current_stream(index).cuda_stream


def _stream(t):
    return ctypes.c_void_p(_raw_stream(t.get_device()))


@contextlib.contextmanager
def _refusals_shared(comm, op):
    """This package's own refusal of a call's arguments goes through the op's agreement across ranks
    (asynctp_refuse_call), so that the other ranks' calls fail at once instead of waiting out the timeout."""
    try:
        yield
    except Error as e:
        _lib.call("refuse_call", comm.handle, op.encode(), str(e).encode(), ctypes.c_void_p(_raw_stream(comm.device)), 1)
        raise  # refuse_call raised already; kept for readers


def _check_device(comm, t, op, name):
    if t.get_device() != comm.device:
        raise Error(f"rank {comm.rank}: {op}: {name} is on {t.device}; the communicator of its group was made on "
                    f"cuda:{comm.device} (the current device when the group's first asynctp op ran)")


def _as_rows(t, dim):
    """(the leading shape, t as a dense [rows, t.shape[-1]] matrix): `dim` moved to the front first
    unless it is already there or is the last dim, whose rows are t's own."""
    x = t if dim in (0, t.dim() - 1) else t.movedim(dim, 0)
    return list(x.shape[:-1]), x.reshape(-1, x.shape[-1]).contiguous()


class _AllGatherShapes:
    """How all_gather_matmul maps torch's N-dim A and gather_dim onto asynctp's 2-dim op, and back.

    gather_dim last: the shards are concatenated along K (asynctp's gather_dim 1). Any other dim is
    moved to the front and the rest flattened into rows (asynctp's gather_dim 0), as torch's fused op
    does; results are moved back, so they are views with the same strides as torch's."""

    def __init__(self, a_shard, gather_dim, world):
        op = "all_gather_matmul"
        if a_shard.dim() < 2:
            raise Error(f"{op}: a_shard has {a_shard.dim()} dims; expected at least 2 ([..., K])")
        self.world = world
        self.dim = _dim(gather_dim, a_shard.dim(), op, "gather_dim")
        self.along_k = self.dim == a_shard.dim() - 1
        self.lead, self.a2 = _as_rows(a_shard, self.dim)
        rows, k = self.a2.shape
        self.rows, self.k = (rows, k * world) if self.along_k else (rows * world, k)

    def unflatten(self, flat):
        if len(self.lead) == 1:  # a 2-dim A: asynctp's result is torch's
            return flat
        if self.along_k:
            return flat.view(*self.lead, flat.shape[-1])
        return flat.view(self.world, *self.lead, flat.shape[-1]).flatten(0, 1).movedim(0, self.dim)

    def allocate(self, bs, return_a):
        outs = [self.a2.new_empty(self.rows, b.shape[1]) for b in bs]
        a_full = self.a2.new_empty(self.rows, self.k) if return_a else None
        return a_full, outs


class _ReduceScatterShapes:
    """matmul_reduce_scatter's N-dim A onto asynctp's 2-dim op: scatter_dim last splits N (asynctp's
    scatter_dim 1); any other dim is moved to the front and split there (asynctp's scatter_dim 0)."""

    def __init__(self, a, b, scatter_dim, world):
        op = "matmul_reduce_scatter"
        if a.dim() < 2:
            raise Error(f"{op}: a has {a.dim()} dims; expected at least 2 ([..., K])")
        if b.dim() != 2:
            raise Error(f"{op}: b has {b.dim()} dims; expected 2 ([K, N])")
        self.world = world
        self.dim = _dim(scatter_dim, a.dim(), op, "scatter_dim")
        self.along_n = self.dim == a.dim() - 1
        n = b.shape[1]
        self.lead, self.a2 = _as_rows(a, self.dim)
        if self.along_n:
            if n % world:
                raise Error(f"{op}: b.shape[1] (N) is {n}; with scatter_dim last it must divide by the world size {world}")
            self.out_shape = (self.a2.shape[0], n // world)
        else:
            if self.lead[0] % world:
                raise Error(f"{op}: a.shape[{self.dim}] is {self.lead[0]}; it must divide by the world size {world} "
                            "(each rank keeps an equal slice along scatter_dim)")
            self.out_shape = (self.a2.shape[0] // world, n)

    def allocate(self):
        return self.a2.new_empty(self.out_shape)

    def unflatten(self, flat):
        if len(self.lead) == 1:
            return flat
        if self.along_n:
            return flat.view(*self.lead, flat.shape[-1])
        return flat.view(self.lead[0] // self.world, *self.lead[1:], flat.shape[-1]).movedim(0, self.dim)


def _world(group_name_):
    return c10d._resolve_process_group(group_name_).size()


_AG_SCHEMA = ("(Tensor a_shard, Tensor[] bs, int gather_dim, str group_name, bool return_a, str algorithm, "
              "int chunks_per_rank) -> (Tensor?, Tensor[])")
_RS_SCHEMA = ("(Tensor a, Tensor b, str reduce_op, int scatter_dim, str group_name, str algorithm, "
              "int chunks_per_rank) -> Tensor")


# The host cost of a call (docs/reference/python_api.md, "Host cost"): what a call passes to the library
# but its data pointers depends only on its arguments' layout (shapes, strides, dtypes, device, dims,
# options), so it is checked and built once per layout and copied at each later call.
_MAX_LAYOUTS = 64


def _layout_key(t):
    return (tuple(t.shape), t.stride(), t.dtype, t.get_device())


def _as_is(passed, given):
    """Whether `passed` (what goes to the library) is `given` itself or a view of it from its first
    element, so that a later tensor of the same layout goes by its own pointer."""
    return given.numel() > 0 and passed.data_ptr() == given.data_ptr()


def _kept(cache, key, make):
    hit = cache.get(key)
    if hit is None:
        hit = make()
        if len(cache) >= _MAX_LAYOUTS:
            cache.clear()
        cache[key] = hit
    return hit


class _AgCall:
    """all_gather_matmul's arguments to the library for one layout, without data pointers."""

    def __init__(self, comm, a_shard, bs, gather_dim, return_a, algorithm, chunks_per_rank):
        op = "all_gather_matmul"
        with _refusals_shared(comm, op):
            if not bs:
                raise Error(f"{op}: bs is empty; expected at least one B")
            shapes = _AllGatherShapes(a_shard, gather_dim, comm.world_size)
            _check_device(comm, a_shard, op, "a_shard")
            self.a = bytes(_ref(shapes.a2, op, "a_shard"))
            layout, b_ops = _b_operands(bs, op, "bs")
            a_full, outs = shapes.allocate(bs, return_a)
            self.bs = bytes((_lib.Tensor * len(bs))(*[_ref(b, op, f"bs[{i}]") for i, b in enumerate(b_ops)]))
            self.outs = bytes((_lib.Tensor * len(bs))(*[_ref(o, op, f"outputs[{i}]") for i, o in enumerate(outs)]))
            self.gathered = bytes(_ref(a_full, op, "gathered_a")) if a_full is not None else None
            self.options = _options(op, algorithm, chunks_per_rank, layout)
        # Where A and the Bs go to the library as they are (no copy into another layout), a later call
        # passes their pointers; else it makes the same copies again.
        self.a_as_is = _as_is(shapes.a2, a_shard)
        self.bs_as_is = all(_as_is(o, b) for o, b in zip(b_ops, bs))
        self.out_shapes = [tuple(o.shape) for o in outs]
        self.a_full_shape = tuple(a_full.shape) if a_full is not None else None
        shapes.a2 = None  # the first call's tensors are not kept
        self.shapes = shapes
        self.n = len(bs)

    def __call__(self, comm, a_shard, bs):
        a2 = a_shard if self.a_as_is else _as_rows(a_shard, self.shapes.dim)[1]
        a_ref = _lib.Tensor.from_buffer_copy(self.a)
        a_ref.data = a2.data_ptr()
        b_refs = (_lib.Tensor * self.n).from_buffer_copy(self.bs)
        b_ops = bs if self.bs_as_is else _b_operands(bs, "all_gather_matmul", "bs")[1]
        for i, b in enumerate(b_ops):
            b_refs[i].data = b.data_ptr()
        outs = [a_shard.new_empty(shape) for shape in self.out_shapes]
        out_refs = (_lib.Tensor * self.n).from_buffer_copy(self.outs)
        for i, o in enumerate(outs):
            out_refs[i].data = o.data_ptr()
        a_full = gathered = None
        if self.a_full_shape is not None:
            a_full = a_shard.new_empty(self.a_full_shape)
            gathered = _lib.Tensor.from_buffer_copy(self.gathered)
            gathered.data = a_full.data_ptr()
            gathered = ctypes.byref(gathered)
        _lib.call("all_gather_matmul", comm.handle, ctypes.byref(a_ref), b_refs, self.n,
                  1 if self.shapes.along_k else 0, out_refs, gathered, _stream(a_shard), ctypes.byref(self.options))
        shapes = self.shapes
        return (shapes.unflatten(a_full) if a_full is not None else None), [shapes.unflatten(o) for o in outs]


_ag_calls = {}


def _all_gather_matmul_cuda(a_shard, bs, gather_dim, group_name, return_a, algorithm, chunks_per_rank):
    comm = communicator(group_name)
    key = (group_name, _layout_key(a_shard), tuple(_layout_key(b) for b in bs), gather_dim, return_a, algorithm,
           chunks_per_rank)
    call = _kept(_ag_calls, key, lambda: _AgCall(comm, a_shard, bs, gather_dim, return_a, algorithm, chunks_per_rank))
    return call(comm, a_shard, bs)


_all_gather_matmul = torch.library.custom_op("asynctp::all_gather_matmul", _all_gather_matmul_cuda, mutates_args=(),
                                             device_types="cuda", schema=_AG_SCHEMA)


@_all_gather_matmul.register_fake
def _all_gather_matmul_fake(a_shard, bs, gather_dim, group_name, return_a, algorithm, chunks_per_rank):
    shapes = _AllGatherShapes(a_shard, gather_dim, _world(group_name))
    a_full, outs = shapes.allocate(bs, return_a)
    return (shapes.unflatten(a_full) if a_full is not None else None), [shapes.unflatten(o) for o in outs]


class _RsCall:
    """matmul_reduce_scatter's arguments to the library for one layout, without data pointers."""

    def __init__(self, comm, a, b, reduce_op, scatter_dim, algorithm, chunks_per_rank):
        op = "matmul_reduce_scatter"
        with _refusals_shared(comm, op):
            shapes = _ReduceScatterShapes(a, b, scatter_dim, comm.world_size)
            _check_device(comm, a, op, "a")
            self.reduce_code = _lib.REDUCE_OPS.get(reduce_op)
            if self.reduce_code is None:
                raise Error(f"{op}: reduce_op is {reduce_op!r}; expected 'sum' or 'avg'")
            self.a = bytes(_ref(shapes.a2, op, "a"))
            layout, (b_op,) = _b_operands([b], op, "b")
            out = shapes.allocate()
            self.b = bytes(_ref(b_op, op, "b"))
            self.out = bytes(_ref(out, op, "output"))
            self.options = _options(op, algorithm, chunks_per_rank, layout)
        self.a_as_is = _as_is(shapes.a2, a)
        self.b_as_is = _as_is(b_op, b)
        self.out_shape = tuple(out.shape)
        shapes.a2 = None  # the first call's tensors are not kept
        self.shapes = shapes

    def __call__(self, comm, a, b):
        a2 = a if self.a_as_is else _as_rows(a, self.shapes.dim)[1]
        a_ref = _lib.Tensor.from_buffer_copy(self.a)
        a_ref.data = a2.data_ptr()
        b_op = b if self.b_as_is else _b_operands([b], "matmul_reduce_scatter", "b")[1][0]
        b_ref = _lib.Tensor.from_buffer_copy(self.b)
        b_ref.data = b_op.data_ptr()
        out = a.new_empty(self.out_shape)
        out_ref = _lib.Tensor.from_buffer_copy(self.out)
        out_ref.data = out.data_ptr()
        _lib.call("matmul_reduce_scatter", comm.handle, ctypes.byref(a_ref), ctypes.byref(b_ref),
                  1 if self.shapes.along_n else 0, self.reduce_code, ctypes.byref(out_ref), _stream(a),
                  ctypes.byref(self.options))
        return self.shapes.unflatten(out)


_rs_calls = {}


def _matmul_reduce_scatter_cuda(a, b, reduce_op, scatter_dim, group_name, algorithm, chunks_per_rank):
    comm = communicator(group_name)
    key = (group_name, _layout_key(a), _layout_key(b), reduce_op, scatter_dim, algorithm, chunks_per_rank)
    call = _kept(_rs_calls, key, lambda: _RsCall(comm, a, b, reduce_op, scatter_dim, algorithm, chunks_per_rank))
    return call(comm, a, b)


_matmul_reduce_scatter = torch.library.custom_op("asynctp::matmul_reduce_scatter", _matmul_reduce_scatter_cuda,
                                                 mutates_args=(), device_types="cuda", schema=_RS_SCHEMA)


@_matmul_reduce_scatter.register_fake
def _matmul_reduce_scatter_fake(a, b, reduce_op, scatter_dim, group_name, algorithm, chunks_per_rank):
    shapes = _ReduceScatterShapes(a, b, scatter_dim, _world(group_name))
    return shapes.unflatten(shapes.allocate())


# --- autograd: the backward of each op is the other op ---------------------------------------------

def _flat_rows(t):
    return t.reshape(-1, t.shape[-1])


def _ag_setup(ctx, inputs, output):
    a_shard, bs, gather_dim, name, return_a, algorithm, chunks = inputs
    ctx.args = (gather_dim, name, return_a, algorithm, chunks)
    # The gathered A is needed for the weights' gradients: kept where the op returned it, else
    # gathered again in backward (memory over time, as activation checkpointing would choose).
    ctx.save_for_backward(output[0] if return_a else a_shard, *bs)


def _ag_backward(ctx, grad_a_full, grad_outs):
    gather_dim, name, return_a, algorithm, chunks = ctx.args
    saved, *bs = ctx.saved_tensors
    pairs = [(g, b) for g, b in zip(grad_outs, bs) if g is not None]
    grad_a_shard = None
    if pairs:
        # d(a_shard) = reduce_scatter(sum_i dC_i @ B_i^T): one matmul_reduce_scatter over the Bs side by side.
        g = torch.cat([p[0] for p in pairs], dim=-1) if len(pairs) > 1 else pairs[0][0]
        b = torch.cat([p[1] for p in pairs], dim=1) if len(pairs) > 1 else pairs[0][1]
        grad_a_shard = torch.ops.asynctp.matmul_reduce_scatter(g, b.t(), "sum", gather_dim, name, algorithm, chunks)
    if grad_a_full is not None:
        rs = funcol.wait_tensor(funcol.reduce_scatter_tensor(grad_a_full.contiguous(), "sum", gather_dim, name))
        grad_a_shard = rs if grad_a_shard is None else grad_a_shard + rs
    grad_bs = [None] * len(grad_outs)
    if pairs:
        a_full = saved if return_a else funcol.wait_tensor(
            funcol.all_gather_tensor(saved.contiguous(), gather_dim, name))
        a_rows_t = _flat_rows(a_full).t()  # once for every B (a copy where A was gathered along a middle dim)
        grad_bs = [None if g is None else a_rows_t @ _flat_rows(g) for g in grad_outs]
    return grad_a_shard, grad_bs, None, None, None, None, None


def _rs_setup(ctx, inputs, output):
    a, b, reduce_op, scatter_dim, name, algorithm, chunks = inputs
    ctx.args = (reduce_op, scatter_dim, name, algorithm, chunks)
    ctx.save_for_backward(a, b)


def _rs_backward(ctx, grad_out):
    reduce_op, scatter_dim, name, algorithm, chunks = ctx.args
    a, b = ctx.saved_tensors
    if reduce_op == "avg":
        grad_out = grad_out / _world(name)
    # dP = all_gather(d_out) along scatter_dim; d(a) = dP @ b^T is one all_gather_matmul, which also
    # returns dP for d(b) = a^T @ dP.
    grad_p, (grad_a,) = torch.ops.asynctp.all_gather_matmul(grad_out, [b.t()], scatter_dim, name, True, algorithm,
                                                             chunks)
    grad_b = _flat_rows(a).t() @ _flat_rows(grad_p)
    return grad_a, grad_b, None, None, None, None, None


_all_gather_matmul.register_autograd(_ag_backward, setup_context=_ag_setup)
_matmul_reduce_scatter.register_autograd(_rs_backward, setup_context=_rs_setup)


# --- the public functions --------------------------------------------------------------------------

try:
    from torch.utils._python_dispatch import _get_current_dispatch_mode as _dispatch_mode
except ImportError:  # no way to tell: always take the dispatcher
    def _dispatch_mode():
        return True


def _direct(*tensors):
    """Whether a call may skip PyTorch's dispatcher and run the CUDA implementation itself.

    The dispatcher's work for a custom op (autograd, fake tensors, tracing, modes) measured up to
    ~110 us of host time per call on 2xH200 (docs/reference/python_api.md), which a GPU waiting on the op sees. It is skipped only where none of it
    applies: plain CUDA tensors, no gradient wanted, not being compiled, no dispatch mode active."""
    if torch.compiler.is_compiling() or _dispatch_mode() is not None:
        return False
    grad = torch.is_grad_enabled()
    for t in tensors:
        if type(t) is not torch.Tensor or not t.is_cuda or (grad and t.requires_grad):
            return False
    return True


def all_gather_matmul(a_shard, bs, gather_dim=0, group=None, return_a=True, *, algorithm="auto", chunks_per_rank=0):
    """All-gathers `a_shard` along `gather_dim` over `group` and multiplies the result by each B.

    Same arguments and results as torch.ops.symm_mem.fused_all_gather_matmul(a_shard, bs, gather_dim,
    group_name, return_A=return_a): returns (the gathered A or None, [A @ B for B in bs]). `group` is a
    ProcessGroup, its name, or None for the default group. algorithm: "auto" (default), "sequential",
    "pipelined" or "fused"; chunks_per_rank: asynctp::OpOptions::chunks_per_rank (0: the default)."""
    args = (a_shard, list(bs), gather_dim, group_name(group), return_a, algorithm, chunks_per_rank)
    if _direct(a_shard, *args[1]):
        return _all_gather_matmul_cuda(*args)
    return torch.ops.asynctp.all_gather_matmul(*args)


def matmul_reduce_scatter(a, b, reduce_op="sum", scatter_dim=0, group=None, *, algorithm="auto", chunks_per_rank=0):
    """Multiplies `a` by `b` and reduce-scatters the product ("sum" or "avg") along `scatter_dim`.

    Same arguments and result as torch.ops.symm_mem.fused_matmul_reduce_scatter(a, b, reduce_op,
    scatter_dim, group_name)."""
    args = (a, b, reduce_op, scatter_dim, group_name(group), algorithm, chunks_per_rank)
    if _direct(a, b):
        return _matmul_reduce_scatter_cuda(*args)
    return torch.ops.asynctp.matmul_reduce_scatter(*args)
