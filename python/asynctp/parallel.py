"""DTensor tensor-parallel styles whose sequence-parallel linears run asynctp's fused ops, in eager mode.

    from asynctp.parallel import ColwiseParallel, RowwiseParallel   # in place of torch's
    parallelize_module(block, tp_mesh, {
        "w1": ColwiseParallel(input_layouts=Shard(1)),
        "w3": ColwiseParallel(input_layouts=Shard(1)),
        "w2": RowwiseParallel(output_layouts=Shard(1)),
    })

They take the arguments of torch.distributed.tensor.parallel's ColwiseParallel and RowwiseParallel and
shard the parameters the same way (weight Shard(0) and bias Shard(0) column-wise; weight Shard(1) and
bias Replicate row-wise), so checkpoints and optimizers see what they would see with torch's. Where the
layer is an nn.Linear on a 1-D mesh and the layouts ask for sequence parallelism, the forward differs:
- ColwiseParallel with input_layouts=Shard(d): the all-gather of the input along d and the matmul are
  one asynctp.all_gather_matmul, instead of a redistribute to Replicate and then a matmul;
- RowwiseParallel with output_layouts=Shard(d): the matmul and the reduce-scatter along d are one
  asynctp.matmul_reduce_scatter, instead of a matmul and then a redistribute of the Partial result.
Elsewhere (other layouts, other modules) they are torch's styles unchanged. Gradients come from the
ops' autograd formulas; torch.compile is not needed.
"""

import types

import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import style as _torch_style

from ._lib import Error
from .ops import all_gather_matmul, matmul_reduce_scatter


def _normalized(placement, ndim):
    return Shard(placement.dim % ndim) if isinstance(placement, Shard) else placement


def _local_as(x, mesh, annotated, wanted):
    """This rank's part of `x` laid out as `wanted`, differentiable back to x: x is a DTensor, or a local
    tensor laid out as `annotated` (the style's input_layouts)."""
    ndim = x.dim()
    wanted = _normalized(wanted, ndim)
    if not isinstance(x, DTensor):
        if _normalized(annotated, ndim) == wanted:
            return x
        x = DTensor.from_local(x, mesh, (annotated,), run_check=False)
    if _normalized(x.placements[0], ndim) != wanted:
        x = x.redistribute(mesh, (wanted,))
    return x.to_local()


def _output(y, mesh, placement, wanted, use_local_output):
    """The style's output: y is this rank's part laid out as `placement`; redistributed to `wanted`."""
    out = DTensor.from_local(y, mesh, (placement,), run_check=False)
    if _normalized(wanted, y.dim()) != placement:
        out = out.redistribute(mesh, (wanted,))
    return out.to_local() if use_local_output else out


def _replicated_bias(bias, group):
    """The whole bias, to add to this rank's rows; its gradient is summed over every rank's rows, so
    that it is Replicate like the parameter (as with torch's RowwiseParallel)."""
    local = bias.to_local(grad_placements=(Replicate(),))
    if local.requires_grad:
        local.register_hook(lambda grad: _summed_over(grad, group))
    return local


def _summed_over(grad, group):
    grad = grad.clone()
    dist.all_reduce(grad, group=group)
    return grad


class _FusedStyle:
    """What asynctp's styles add to torch's: the op's options, and where the layer fuses (an nn.Linear
    on a 1-D mesh, in the layouts _fuses accepts), a forward of their own (_forward)."""

    def __init__(self, *, input_layouts=None, output_layouts=None, use_local_output=True, algorithm="auto",
                 chunks_per_rank=0):
        super().__init__(input_layouts=input_layouts, output_layouts=output_layouts, use_local_output=use_local_output)
        self.algorithm = algorithm
        self.chunks_per_rank = chunks_per_rank

    def _apply(self, module, device_mesh):
        if not (isinstance(module, nn.Linear) and device_mesh.ndim == 1 and self._fuses()):
            return super()._apply(module, device_mesh)
        self._partition_linear_fn(None, module, device_mesh)
        module.forward = types.MethodType(lambda mod, x: self._forward(mod, x, device_mesh), module)
        return module


class ColwiseParallel(_FusedStyle, _torch_style.ColwiseParallel):
    """torch's ColwiseParallel; with input_layouts=Shard(d) on an nn.Linear, the gather along d and the
    matmul are one asynctp.all_gather_matmul. algorithm and chunks_per_rank are the op's."""

    def _fuses(self):
        return isinstance(self.input_layouts[0], Shard)

    def _forward(self, mod, x, mesh):
        layout = self.input_layouts[0]
        dim = layout.dim % x.dim()
        if dim == x.dim() - 1:
            raise Error(f"asynctp.parallel.ColwiseParallel: input_layouts is {layout}, the features that "
                        "nn.Linear contracts over; expected Shard of the sequence or batch dim")
        x_local = _local_as(x, mesh, layout, layout)
        _, (y,) = all_gather_matmul(x_local, [mod.weight.to_local().t()], dim, mesh.get_group().group_name,
                                    return_a=False, algorithm=self.algorithm, chunks_per_rank=self.chunks_per_rank)
        if mod.bias is not None:
            y = y + mod.bias.to_local()
        return _output(y, mesh, Shard(y.dim() - 1), self.output_layouts[0], self.use_local_output)


class RowwiseParallel(_FusedStyle, _torch_style.RowwiseParallel):
    """torch's RowwiseParallel; with output_layouts=Shard(d) on an nn.Linear, the matmul and the
    reduce-scatter along d are one asynctp.matmul_reduce_scatter. algorithm and chunks_per_rank are
    the op's."""

    def _fuses(self):
        return isinstance(self.output_layouts[0], Shard)

    def _forward(self, mod, x, mesh):
        x_local = _local_as(x, mesh, self.input_layouts[0], Shard(-1))
        dim = self.output_layouts[0].dim % x_local.dim()
        pg = mesh.get_group()
        y = matmul_reduce_scatter(x_local, mod.weight.to_local().t(), "sum", dim, pg.group_name,
                                  algorithm=self.algorithm, chunks_per_rank=self.chunks_per_rank)
        if mod.bias is not None:
            y = y + _replicated_bias(mod.bias, pg)
        return _output(y, mesh, Shard(dim), Shard(dim), self.use_local_output)


__all__ = ["ColwiseParallel", "RowwiseParallel"]
