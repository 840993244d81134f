"""How the torch ops' N-dim tensors and dims map onto the library's 2-dim ops, and the results back;
shared by the real and the fake implementations, so that both give the same shapes and strides."""

from ._lib import Error


def _dim(dim, ndim, op, name):
    d = dim + ndim if dim < 0 else dim
    if not 0 <= d < ndim:
        raise Error(f"{op}: {name} is {dim}; expected a dim of a {ndim}-dim tensor (-{ndim} to {ndim - 1})")
    return d


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
