"""asynctp for PyTorch: all-gather + matmul and matmul + reduce-scatter with the communication hidden.

    import asynctp
    a_full, (gate, up) = asynctp.all_gather_matmul(x_shard, [w_gate.t(), w_up.t()], 0)
    y_shard = asynctp.matmul_reduce_scatter(h, w_down.t(), "sum", 0)

The ops are also registered as torch.ops.asynctp.all_gather_matmul and
torch.ops.asynctp.matmul_reduce_scatter: in C++ by libasynctp_torch.so where it was built, else in
Python. The C++ library stays free of PyTorch: this package loads its C interface (libasynctp_c.so)
with ctypes. docs/reference/python_api.md has the details.
"""

import importlib

from ._lib import Error, library_path, version

_TORCH_API = ("all_gather_matmul", "matmul_reduce_scatter", "all_gather_scaled_matmul", "scaled_matmul_reduce_scatter",
              "communicator", "shutdown", "Communicator", "symmetric")

__all__ = ["Error", "library_path", "version", *_TORCH_API]


def __getattr__(name):
    # The ops need PyTorch; the library checks (version, library_path, Error) do not.
    if name not in _TORCH_API:
        raise AttributeError(f"module 'asynctp' has no attribute {name!r}")
    try:
        from . import comm, ops, scaled  # noqa: PLC0415 (registers the torch ops on first use)

        if name == "symmetric":  # a submodule: imported by name, as `from . import` would ask __getattr__
            return importlib.import_module(".symmetric", __name__)
    except ImportError as e:
        raise ImportError(f"asynctp.{name} needs PyTorch ({e})") from e
    value = getattr(ops, name, None) or getattr(scaled, name, None) or getattr(comm, name)
    globals()[name] = value  # found once: a later asynctp.<name> skips this function (host time per call)
    return value
