"""The ops' direct path keeps what a call passes to the library per layout of its arguments (the host
cost per call). Without a GPU: the library call is replaced by one that records its arguments, and
CPU tensors stand in. For each layout, a second call with other tensors of the same layout must pass
what a fresh build of the arguments would pass, with the new tensors' pointers."""

import ctypes

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: the ops' host path is not tested here")

from asynctp import _calls, _lib, ops  # noqa: E402

WORLD = 2


class Comm:
    handle = ctypes.c_void_p(1)
    device = -1  # CPU tensors' get_device()
    rank = 0
    world_size = WORLD


def _tensor(t):
    return (t.data, t.dtype, t.ndim, tuple(t.shape[:t.ndim]), tuple(t.strides[:t.ndim]))


def _decode(args):
    out = []
    for a in args:
        obj = getattr(a, "_obj", a)  # ctypes.byref(x) holds x as _obj
        if isinstance(obj, _lib.Tensor):
            out.append(_tensor(obj))
        elif isinstance(obj, ctypes.Array):
            out.append([_tensor(t) for t in obj])
        elif isinstance(obj, _lib.OpOptions):
            out.append((obj.algorithm, obj.b_layout, obj.check_across_ranks, obj.chunks_per_rank))
        elif isinstance(obj, ctypes.c_void_p):
            out.append(obj.value)
        else:
            out.append(obj)
    return out


@pytest.fixture
def recorded(monkeypatch):
    calls = []
    monkeypatch.setattr(_lib, "call", lambda name, *args: calls.append((name, _decode(args))))
    monkeypatch.setattr(ops, "communicator", lambda name: Comm())
    monkeypatch.setattr(_calls, "_stream", lambda t: ctypes.c_void_p(0))
    monkeypatch.setattr(_calls, "_raw_stream", lambda device: 0)
    ops._ag_calls.clear()
    ops._rs_calls.clear()
    return calls


def _blank(t):
    return (None,) + t[1:]


def _without_new_pointers(decoded, name, copied):
    """The decoded arguments with the pointers that differ by call blanked: the freshly allocated
    outputs', and those of inputs `copied` into another layout (0: A, 1: the Bs)."""
    d = [list(x) if isinstance(x, list) else x for x in decoded]
    outs = 5  # all_gather_matmul: (comm, a, bs, n, along_k, outs, gathered, ...); matmul_reduce_scatter: (comm, a, b, along_n, op, out, ...)
    d[outs] = [_blank(t) for t in d[outs]] if isinstance(d[outs], list) else _blank(d[outs])
    if name == "all_gather_matmul" and d[6] is not None:
        d[6] = _blank(d[6])
    if 0 in copied:
        d[1] = _blank(d[1])
    if 1 in copied:
        d[2] = [_blank(t) for t in d[2]] if isinstance(d[2], list) else _blank(d[2])
    return d


def bf16(*shape):
    return torch.randn(*shape).to(torch.bfloat16)


# name: (make the arguments, which inputs go to the library as copies: 0 A, 1 the Bs)
AG_CASES = {
    "rows, two linear weights": (lambda: (bf16(32, 64), [bf16(48, 64).t(), bf16(16, 64).t()], 0, True), ()),
    "rows, B row-major": (lambda: (bf16(32, 64), [bf16(64, 24)], 0, False), ()),
    "a middle dim": (lambda: (bf16(3, 8, 64), [bf16(64, 24)], 1, True), (0,)),
    "the last dim": (lambda: (bf16(32, 64), [bf16(128, 24)], -1, True), ()),
    "B in neither layout": (lambda: (bf16(32, 64), [bf16(64, 48)[:, ::2]], 0, False), (1,)),
}


@pytest.mark.parametrize("name", list(AG_CASES))
def test_a_kept_all_gather_layout_passes_what_a_fresh_one_would(recorded, name):
    make, copied = AG_CASES[name]
    first, second = make(), make()
    ops._all_gather_matmul_cuda(*first[:3], "g", first[3], "fused", 2)
    kept = ops._all_gather_matmul_cuda(*second[:3], "g", second[3], "fused", 2)
    ops._ag_calls.clear()
    fresh = ops._all_gather_matmul_cuda(*second[:3], "g", second[3], "fused", 2)
    (_, _), (_, b), (_, c) = recorded
    op = "all_gather_matmul"
    assert _without_new_pointers(b, op, copied) == _without_new_pointers(c, op, copied)
    if 0 not in copied:
        assert b[1][0] == second[0].data_ptr()
    if 1 not in copied:
        assert [t[0] for t in b[2]] == [x.data_ptr() for x in second[1]]
    assert [(o.shape, o.stride()) for o in kept[1]] == [(o.shape, o.stride()) for o in fresh[1]]
    assert (kept[0] is None) == (fresh[0] is None)


RS_CASES = {
    "rows, a linear weight": (lambda: (bf16(64, 32), bf16(48, 32).t(), "sum", 0), ()),
    "a middle dim": (lambda: (bf16(2, 16, 32), bf16(32, 24), "avg", 1), (0,)),
    "the last dim": (lambda: (bf16(16, 32), bf16(32, 48), "sum", -1), ()),
}


@pytest.mark.parametrize("name", list(RS_CASES))
def test_a_kept_reduce_scatter_layout_passes_what_a_fresh_one_would(recorded, name):
    make, copied = RS_CASES[name]
    first, second = make(), make()
    ops._matmul_reduce_scatter_cuda(*first, "g", "pipelined", 0)
    kept = ops._matmul_reduce_scatter_cuda(*second, "g", "pipelined", 0)
    ops._rs_calls.clear()
    fresh = ops._matmul_reduce_scatter_cuda(*second, "g", "pipelined", 0)
    (_, _), (_, b), (_, c) = recorded
    op = "matmul_reduce_scatter"
    assert _without_new_pointers(b, op, copied) == _without_new_pointers(c, op, copied)
    assert b[2][0] == second[1].data_ptr()
    assert (kept.shape, kept.stride()) == (fresh.shape, fresh.stride())


def test_a_refused_layout_is_not_kept(recorded):
    with pytest.raises(_lib.Error, match="gather_dim is 2; expected a dim of a 2-dim tensor"):
        ops._all_gather_matmul_cuda(bf16(32, 64), [bf16(64, 24)], 2, "g", True, "auto", 0)
    assert ops._ag_calls == {}
    # Refused before the library was reached for the op; the refusal itself went to the peers.
    assert [name for name, _ in recorded] == ["refuse_call"]
