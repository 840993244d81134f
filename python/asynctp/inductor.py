"""torch.compile's async tensor parallelism, run by asynctp's ops.

    import asynctp.inductor
    asynctp.inductor.enable_async_tp(tp_group)   # once, before the model is compiled
    model = torch.compile(model)

Inductor's micro-pipeline TP pass (``torch._inductor.config._micro_pipeline_tp``) turns an all-gather
followed by matmuls into ``torch.ops.symm_mem.fused_all_gather_matmul``, and a matmul followed by a
reduce-scatter into ``fused_matmul_reduce_scatter``, for the groups with symmetric memory enabled.
``enable_async_tp`` switches that pass on for the group and adds a pass after it (inductor's
``post_grad_custom_post_pass``) that puts ``torch.ops.asynctp.all_gather_matmul`` and
``matmul_reduce_scatter`` in their place: the same arguments with the same meaning, so every variant the
pass emits (gather or scatter along dim 0, a middle dim or the last, transposed B, several Bs) maps one
to one. Its scaled (fp8) forms become ``all_gather_scaled_matmul`` and ``scaled_matmul_reduce_scatter``
where asynctp's scaled ops take their options. The model is not changed.

The pass is tied to inductor's internals, which change between PyTorch versions: ``enable_async_tp``
refuses a version it is not tested with (``TESTED_TORCH``) instead of guessing.
"""

import logging

import torch
import torch._inductor.config as inductor_config
from torch._inductor.custom_graph_pass import CustomGraphPass
from torch.fx.operator_schemas import normalize_function

from . import ops, scaled  # noqa: F401 (register torch.ops.asynctp)
from ._lib import Error
from .comm import group_name as _group_name

# The PyTorch releases (major.minor) whose micro-pipeline TP pass this module is tested against.
TESTED_TORCH = ("2.11",)

# Bumped whenever the rewrite changes, so that inductor's cache of compiled graphs does not serve
# graphs rewritten by an older one.
_REWRITE_VERSION = 3

_log = logging.getLogger("asynctp.inductor")
_DTYPES = (torch.bfloat16, torch.float16)


def _torch_release():
    return ".".join(torch.__version__.split("+")[0].split(".")[:2])


def check_torch_version():
    """Raises asynctp.Error unless this PyTorch is one the rewrite is tested with."""
    release = _torch_release()
    if release not in TESTED_TORCH:
        raise Error(f"asynctp.inductor: PyTorch {torch.__version__} is not a version asynctp's torch.compile pass "
                    f"is tested with (expected {', '.join(TESTED_TORCH)}): inductor's micro-pipeline TP pass "
                    "differs between versions, so the pass is not installed. Call asynctp.all_gather_matmul and "
                    "asynctp.matmul_reduce_scatter directly, or use a tested PyTorch")


def _arguments(node):
    return normalize_function(node.target, tuple(node.args), dict(node.kwargs), normalize_to_only_use_kwargs=True).kwargs


def _val(arg):
    """The fake tensor a graph node carries (through the stride-forcing node that inductor's pass puts
    before A, which carries none); None where there is none."""
    while isinstance(arg, torch.fx.Node):
        val = arg.meta.get("val")
        if val is not None:
            return val
        if arg.target is not torch.ops.prims.inductor_force_stride_order.default:
            return None
        arg = arg.args[0]
    return None


def _dtype_of(a):
    return getattr(_val(a), "dtype", None)


def _fake_result(target, args):
    """What `target` returns on the fake tensors that `args`' nodes carry, by asynctp's own fake
    implementation (whose strides can differ from torch's: the graph must see asynctp's); None where the
    nodes carry none."""
    from torch._guards import detect_fake_mode
    from torch.utils._pytree import tree_flatten, tree_map

    nodes = [a for a in tree_flatten(args)[0] if isinstance(a, torch.fx.Node)]
    if any(_val(n) is None for n in nodes):
        return None
    vals = tree_map(lambda a: _val(a) if isinstance(a, torch.fx.Node) else a, args)
    mode = detect_fake_mode(tree_flatten(vals)[0])
    if mode is None:
        return None
    with mode:
        return target(*vals)


_SCALED_OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float8_e4m3fn)


def _scaled_unsupported(a_scale, result_scales, out_dtypes, fast_accum):
    """Why asynctp's scaled ops cannot take a scaled fused op's options, or None where they can."""
    if any(d not in _SCALED_OUT_DTYPES for d in out_dtypes) or len(set(out_dtypes)) != 1:
        return f"its output dtypes are {list(out_dtypes)}; asynctp's scaled ops give one of bf16, fp16 or fp8 e4m3"
    fp8_out = out_dtypes[0] == torch.float8_e4m3fn
    if not fp8_out and any(s is not None for s in result_scales):
        return "it gives a result scale to a 16-bit output; asynctp's scaled ops take one for fp8 outputs only"
    scale = _val(a_scale)
    if fp8_out and scale is not None and scale.numel() > 1:
        return "its fp8 output has row-wise scales; asynctp's scaled ops give fp8 with tensor-wise ones"
    if len(set(fast_accum)) != 1:
        return "its Bs differ in use_fast_accum; asynctp's scaled op takes one"
    return None


def _replacement(node, algorithm, chunks_per_rank):
    """(target, args) of the asynctp op that takes `node`'s place, or (None, why) where none does."""
    symm_mem = torch.ops.symm_mem
    if node.target is symm_mem.fused_all_gather_matmul.default:
        kw = _arguments(node)
        args = (kw["A"], kw["Bs"], kw["gather_dim"], kw["group_name"], kw.get("return_A", True), algorithm,
                chunks_per_rank)
        target = torch.ops.asynctp.all_gather_matmul.default
    elif node.target is symm_mem.fused_matmul_reduce_scatter.default:
        kw = _arguments(node)
        args = (kw["A"], kw["B"], kw["reduce_op"], kw["scatter_dim"], kw["group_name"], algorithm, chunks_per_rank)
        target = torch.ops.asynctp.matmul_reduce_scatter.default
    elif node.target is symm_mem.fused_all_gather_scaled_matmul.default:
        kw = _arguments(node)
        why = _scaled_unsupported(kw["A_scale"], kw["result_scales"], kw["out_dtypes"], kw["use_fast_accum"])
        if why:
            return None, why
        # torch's op always returns the gathered A.
        args = (kw["A"], kw["Bs"], kw["A_scale"], kw["B_scales"], kw["gather_dim"], kw["group_name"], True,
                kw["out_dtypes"][0], kw["use_fast_accum"][0], algorithm, list(kw["biases"]), list(kw["result_scales"]))
        return torch.ops.asynctp.all_gather_scaled_matmul.default, args
    elif node.target is symm_mem.fused_scaled_matmul_reduce_scatter.default:
        kw = _arguments(node)
        why = _scaled_unsupported(kw["A_scale"], [kw.get("result_scale")], [kw.get("out_dtype")],
                                  [kw.get("use_fast_accum", False)])
        a = _val(kw["A"])
        if not why and (kw["orig_scatter_dim"] != kw["scatter_dim_after_maybe_reshape"] or
                        (a is not None and kw["output_shape"] is not None and len(kw["output_shape"]) != a.dim())):
            why = "A was reshaped for the scaled GEMM; asynctp's scaled op takes it as the program had it"
        if why:
            return None, why
        args = (kw["A"], kw["B"], kw["A_scale"], kw["B_scale"], kw["reduce_op"], kw["orig_scatter_dim"],
                kw["group_name"], kw["out_dtype"], kw.get("use_fast_accum", False), algorithm, kw.get("bias"),
                kw.get("result_scale"))
        return torch.ops.asynctp.scaled_matmul_reduce_scatter.default, args
    else:
        return None, None
    dtype = _dtype_of(args[0])
    if dtype is not None and dtype not in _DTYPES:
        return None, f"A is {dtype}; asynctp's ops take torch.bfloat16 and torch.float16"
    return target, args


def rewrite(graph, algorithm="auto", chunks_per_rank=0):
    """Replaces each of torch.ops.symm_mem's fused ops in `graph` (a torch.fx.Graph) by asynctp's op
    of the same meaning, run with `algorithm` and `chunks_per_rank`. A fused op that asynctp cannot run
    (fp8, fp32) stays PyTorch's, and a log line of logger "asynctp.inductor" says which and why.
    Returns how many were replaced."""
    replaced = 0
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        target, args = _replacement(node, algorithm, chunks_per_rank)
        if target is None:
            if args is not None:
                _log.warning("asynctp.inductor: %s left to PyTorch: %s", node.target, args)
            continue
        with graph.inserting_before(node):
            fused = graph.call_function(target, args)
        fused.meta.update({k: v for k, v in node.meta.items() if k not in ("val", "tensor_meta")})
        val = _fake_result(target, args)
        if val is not None:
            fused.meta["val"] = val
        node.replace_all_uses_with(fused)
        graph.erase_node(node)
        replaced += 1
    return replaced


class AsyncTpPass(CustomGraphPass):
    """The post-grad pass enable_async_tp installs: rewrite(), then the pass that was installed before it
    (if any). Its uuid() lets inductor cache the graphs it compiles."""

    def __init__(self, algorithm="auto", chunks_per_rank=0, previous=None):
        self.algorithm = algorithm
        self.chunks_per_rank = chunks_per_rank
        self.previous = previous

    def __call__(self, graph):
        rewrite(graph, self.algorithm, self.chunks_per_rank)
        if self.previous is not None:
            self.previous(graph)

    def uuid(self):
        previous = None
        if self.previous is not None:
            previous = self.previous.uuid() if isinstance(self.previous, CustomGraphPass) else None
            if previous is None:
                return None  # a previous pass without a uuid: inductor must not cache
        return ("asynctp.inductor", _REWRITE_VERSION, self.algorithm, self.chunks_per_rank, previous)


def enable_async_tp(group=None, *, algorithm="auto", chunks_per_rank=0):
    """Makes torch.compile (inductor) run asynctp's ops for the all-gather + matmuls and matmul +
    reduce-scatters of `group` (a ProcessGroup or its name; None: the default group). Call it before the
    model is compiled, on every rank. It turns on inductor's micro-pipeline TP pass, enables PyTorch's
    symmetric memory for the group (the pass acts only on such groups) and installs AsyncTpPass as
    inductor's post_grad_custom_post_pass, keeping a pass installed there before. Calling it again for
    another group adds that group. Raises asynctp.Error on a PyTorch version it is not tested with."""
    check_torch_version()
    from torch.distributed._symmetric_memory import enable_symm_mem_for_group

    enable_symm_mem_for_group(_group_name(group))
    inductor_config._micro_pipeline_tp = True
    current = inductor_config.post_grad_custom_post_pass
    if isinstance(current, AsyncTpPass):
        current.algorithm, current.chunks_per_rank = algorithm, chunks_per_rank
    else:
        inductor_config.post_grad_custom_post_pass = AsyncTpPass(algorithm, chunks_per_rank, current)


def disable_async_tp():
    """Removes the pass enable_async_tp installed (restoring the one it kept) and turns inductor's
    micro-pipeline TP pass off. Graphs compiled before keep the ops they were compiled with."""
    current = inductor_config.post_grad_custom_post_pass
    if isinstance(current, AsyncTpPass):
        inductor_config.post_grad_custom_post_pass = current.previous
    inductor_config._micro_pipeline_tp = False
