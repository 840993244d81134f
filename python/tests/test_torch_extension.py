"""libasynctp_torch.so, the ops registered in C++ (python/csrc), without a GPU: what it registers, how
it is set up, and how a group's communicator reaches it. The ops' results are checked on a GPU
(test_ops_gpu.py, both registrations). Skipped, saying why, where it is not built."""

import ctypes

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: libasynctp_torch.so is not tested here")

from asynctp import _extension, _lib, comm, ops  # noqa: E402

if not ops.EXTENSION:
    pytest.skip(f"the C++ ops are not in use: {_extension.why_not}", allow_module_level=True)

CUDA_ONLY = torch._C.DispatchKeySet(torch._C.DispatchKey.CUDA)


def test_the_schemas_are_the_python_registrations():
    # The Python registration (ASYNCTP_TORCH_EXTENSION=0) and the C++ one take the same arguments.
    assert str(torch.ops.asynctp.all_gather_matmul.default._schema) == "asynctp::all_gather_matmul" + ops._AG_SCHEMA
    assert str(torch.ops.asynctp.matmul_reduce_scatter.default._schema) == (
        "asynctp::matmul_reduce_scatter" + ops._RS_SCHEMA)


def test_cuda_and_autograd_kernels_are_cpp():
    for name in ("asynctp::all_gather_matmul", "asynctp::matmul_reduce_scatter"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(name, "CUDA"), name
        assert torch._C._dispatch_has_computed_kernel_for_dispatch_key(name, "AutogradCUDA"), name


def test_init_refuses_another_c_api_version():
    ext = ctypes.CDLL(str(_extension.path()))
    functions = _extension._CFunctions(_lib.C_API_VERSION + 1)
    assert ext.asynctp_torch_init(ctypes.byref(functions)) == -1


def _call_cuda_kernel(group):
    # The CUDA kernel itself, on CPU tensors: it asks for the group's communicator before it looks at them.
    a, b = torch.zeros(4, 8, dtype=torch.bfloat16), torch.zeros(8, 2, dtype=torch.bfloat16)
    return torch.ops.asynctp.all_gather_matmul.default.redispatch(CUDA_ONLY, a, [b], 0, group, False, "auto", 0)


def test_a_groups_communicator_is_made_through_the_package():
    # The package's asynctp.communicator(name) runs; its error (no such process group) comes back
    # through C++, unchanged.
    with pytest.raises(RuntimeError, match="no such group"):
        _call_cuda_kernel("no such group")


class _Dead:
    handle = ctypes.c_void_p(0x1000)  # not a communicator the library made


def test_the_c_librarys_error_reaches_python(monkeypatch):
    made = []

    def fake_communicator(name):
        made.append(name)
        return _Dead()

    monkeypatch.setattr(comm, "communicator", fake_communicator)
    try:
        with pytest.raises(RuntimeError, match="asynctp_comm_world_size"):
            _call_cuda_kernel("g1")
        assert made == ["g1"]
    finally:
        _extension.forget(None)
