"""What a call of the torch ops passes to the library (libasynctp_c.so through ctypes): the tensors
as asynctp_tensor structs, the options, the stream, and this package's own refusals shared with the
other ranks. Built once per layout of the arguments and copied with new pointers at each later call."""

import contextlib
import ctypes

import torch

from . import _lib
from ._lib import Error
from ._shapes import _AllGatherShapes, _ReduceScatterShapes, _as_rows

_DTYPES = {torch.bfloat16: _lib.DTYPE_BF16, torch.float16: _lib.DTYPE_FP16, torch.float32: _lib.DTYPE_FP32}


def _ref(t, op, name):
    code = _DTYPES.get(t.dtype)
    if code is None:
        raise Error(f"{op}: {name} is {t.dtype}; expected torch.bfloat16 or torch.float16")
    return _lib.Tensor.of(t.data_ptr(), code, t.shape, t.stride())


def _options(op, algorithm, chunks_per_rank, b_layout):
    code = _lib.ALGORITHMS.get(algorithm)
    if code is None:
        raise Error(f"{op}: algorithm is {algorithm!r}; expected one of " + ", ".join(_lib.ALGORITHMS))
    # Every tensor's device was checked here (_check_device; the outputs are made on A's), so the
    # library need not look each pointer up with CUDA again at every call.
    return _lib.options(code, b_layout, chunks_per_rank, check_pointers=False)


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
            for i, b in enumerate(bs):
                _check_device(comm, b, op, f"bs[{i}]")
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


class _RsCall:
    """matmul_reduce_scatter's arguments to the library for one layout, without data pointers."""

    def __init__(self, comm, a, b, reduce_op, scatter_dim, algorithm, chunks_per_rank):
        op = "matmul_reduce_scatter"
        with _refusals_shared(comm, op):
            shapes = _ReduceScatterShapes(a, b, scatter_dim, comm.world_size)
            _check_device(comm, a, op, "a")
            _check_device(comm, b, op, "b")
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
