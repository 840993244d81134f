"""asynctp's ops as PyTorch custom ops: torch.ops.asynctp.all_gather_matmul and
torch.ops.asynctp.matmul_reduce_scatter.

Arguments and results mean what they mean for torch.ops.symm_mem.fused_all_gather_matmul and
fused_matmul_reduce_scatter. Each op runs on the current CUDA stream; a fake implementation (shapes
and strides only) lets torch.compile trace it, and an autograd formula makes it differentiable: the
backward of each op is the other op (docs/reference/python_api.md).

The ops are registered in C++ by libasynctp_torch.so where it was built (asynctp._extension), with
the fake implementations below; else in Python, by the implementations below."""

import torch
import torch.distributed._functional_collectives as funcol
import torch.distributed.distributed_c10d as c10d

from . import _extension
from ._calls import _AgCall, _RsCall, _kept, _layout_key
from ._lib import Error
from ._shapes import _AllGatherShapes, _ReduceScatterShapes
from .comm import communicator, group_name


def _world(group_name_):
    return c10d._resolve_process_group(group_name_).size()


_AG_SCHEMA = ("(Tensor a_shard, Tensor[] bs, int gather_dim, str group_name, bool return_a, str algorithm, "
              "int chunks_per_rank) -> (Tensor?, Tensor[])")
_RS_SCHEMA = ("(Tensor a, Tensor b, str reduce_op, int scatter_dim, str group_name, str algorithm, "
              "int chunks_per_rank) -> Tensor")


_ag_calls = {}


def _all_gather_matmul_cuda(a_shard, bs, gather_dim, group_name, return_a, algorithm, chunks_per_rank):
    comm = communicator(group_name)
    key = (group_name, _layout_key(a_shard), tuple(_layout_key(b) for b in bs), gather_dim, return_a, algorithm,
           chunks_per_rank)
    call = _kept(_ag_calls, key, lambda: _AgCall(comm, a_shard, bs, gather_dim, return_a, algorithm, chunks_per_rank))
    return call(comm, a_shard, bs)


def _all_gather_matmul_fake(a_shard, bs, gather_dim, group_name, return_a, algorithm, chunks_per_rank):
    shapes = _AllGatherShapes(a_shard, gather_dim, _world(group_name))
    a_full, outs = shapes.allocate(bs, return_a)
    return (shapes.unflatten(a_full) if a_full is not None else None), [shapes.unflatten(o) for o in outs]


_rs_calls = {}


def _matmul_reduce_scatter_cuda(a, b, reduce_op, scatter_dim, group_name, algorithm, chunks_per_rank):
    comm = communicator(group_name)
    key = (group_name, _layout_key(a), _layout_key(b), reduce_op, scatter_dim, algorithm, chunks_per_rank)
    call = _kept(_rs_calls, key, lambda: _RsCall(comm, a, b, reduce_op, scatter_dim, algorithm, chunks_per_rank))
    return call(comm, a, b)


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


# --- registration ----------------------------------------------------------------------------------

EXTENSION = _extension.load()  # the ops registered in C++ (their CUDA and autograd kernels)
if EXTENSION:
    torch.library.register_fake("asynctp::all_gather_matmul")(_all_gather_matmul_fake)
    torch.library.register_fake("asynctp::matmul_reduce_scatter")(_matmul_reduce_scatter_fake)
else:
    _all_gather_matmul = torch.library.custom_op("asynctp::all_gather_matmul", _all_gather_matmul_cuda,
                                                 mutates_args=(), device_types="cuda", schema=_AG_SCHEMA)
    _all_gather_matmul.register_fake(_all_gather_matmul_fake)
    _all_gather_matmul.register_autograd(_ag_backward, setup_context=_ag_setup)
    _matmul_reduce_scatter = torch.library.custom_op("asynctp::matmul_reduce_scatter", _matmul_reduce_scatter_cuda,
                                                     mutates_args=(), device_types="cuda", schema=_RS_SCHEMA)
    _matmul_reduce_scatter.register_fake(_matmul_reduce_scatter_fake)
    _matmul_reduce_scatter.register_autograd(_rs_backward, setup_context=_rs_setup)
_ag_op = torch.ops.asynctp.all_gather_matmul.default
_rs_op = torch.ops.asynctp.matmul_reduce_scatter.default
# The C++ ops' entry points themselves, without OpOverload.__call__'s Python frame (host time per call);
# torch.compile traces the OpOverload instead.
_ag_entry = getattr(_ag_op, "_op", _ag_op)
_rs_entry = getattr(_rs_op, "_op", _rs_op)
_is_compiling = torch.compiler.is_compiling


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


def _as_error(e):
    """The C++ ops' errors reach Python as RuntimeError (PyTorch's translation of c10::Error); the
    public functions raise them as asynctp.Error, as the Python ops do. Subclasses (out of memory, for
    one) stay what they are."""
    return Error(str(e)) if type(e) is RuntimeError else e


def all_gather_matmul(a_shard, bs, gather_dim=0, group=None, return_a=True, *, algorithm="auto", chunks_per_rank=0):
    """All-gathers `a_shard` along `gather_dim` over `group` and multiplies the result by each B.

    Same arguments and results as torch.ops.symm_mem.fused_all_gather_matmul(a_shard, bs, gather_dim,
    group_name, return_A=return_a): returns (the gathered A or None, [A @ B for B in bs]). `group` is a
    ProcessGroup, its name, or None for the default group. algorithm: "auto" (default), "sequential",
    "pipelined" or "fused"; chunks_per_rank: asynctp::OpOptions::chunks_per_rank (0: the default)."""
    args = (a_shard, list(bs), gather_dim, group_name(group), return_a, algorithm, chunks_per_rank)
    if EXTENSION:
        try:
            return _ag_op(*args) if _is_compiling() else _ag_entry(*args)
        except RuntimeError as e:
            raise _as_error(e) from None
    if _direct(a_shard, *args[1]):
        return _all_gather_matmul_cuda(*args)
    return _ag_op(*args)


def matmul_reduce_scatter(a, b, reduce_op="sum", scatter_dim=0, group=None, *, algorithm="auto", chunks_per_rank=0):
    """Multiplies `a` by `b` and reduce-scatters the product ("sum" or "avg") along `scatter_dim`.

    Same arguments and result as torch.ops.symm_mem.fused_matmul_reduce_scatter(a, b, reduce_op,
    scatter_dim, group_name)."""
    args = (a, b, reduce_op, scatter_dim, group_name(group), algorithm, chunks_per_rank)
    if EXTENSION:
        try:
            return _rs_op(*args) if _is_compiling() else _rs_entry(*args)
        except RuntimeError as e:
            raise _as_error(e) from None
    if _direct(a, b):
        return _matmul_reduce_scatter_cuda(*args)
    return _rs_op(*args)
