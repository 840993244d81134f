"""libasynctp_torch.so: asynctp::all_gather_matmul and asynctp::matmul_reduce_scatter registered with
PyTorch's dispatcher in C++ (python/csrc), autograd included, so that a call costs no Python beyond
its own line. It is found beside libasynctp_c.so (built where CMake's Python imports torch); without it,
or with ASYNCTP_TORCH_EXTENSION=0, asynctp.ops registers the same ops in Python (more host time per call).

It does not link libasynctp_c.so: load() hands it the C functions of the copy this package loaded, so
that a communicator made here is one it knows, and a function that makes a group's communicator on
the group's first use."""

import ctypes
import os
import pathlib

import torch

from . import _lib

_Fn = ctypes.c_void_p


class _CFunctions(ctypes.Structure):
    """asynctp_torch_c_functions (python/csrc/library.h)."""

    _fields_ = [("c_api_version", ctypes.c_int32), ("all_gather_matmul", _Fn), ("matmul_reduce_scatter", _Fn),
                ("refuse_call", _Fn), ("last_error", _Fn), ("comm_world_size", _Fn), ("comm_device", _Fn)]


# int (*)(const char* group, asynctp_comm** comm, char* why, size_t why_bytes)
_Factory = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p,
                            ctypes.c_size_t)

_ext = None
why_not = "not loaded yet"  # why the C++ ops are not in use, for the log and the docs' check


def path():
    """Where libasynctp_torch.so is looked for: beside the libasynctp_c.so this package loads."""
    return pathlib.Path(_lib.library_path()).with_name("libasynctp_torch.so")


def _make_communicator(group, comm_out, why, why_bytes):
    # Called by the ops (C++) on a group's first use; no exception may cross into C.
    try:
        from .comm import communicator  # noqa: PLC0415 (comm imports nothing of this module's users)

        comm_out[0] = communicator(group.decode()).handle.value
        return 0
    except BaseException as e:  # noqa: BLE001
        msg = str(e).encode()[: max(why_bytes - 1, 0)]
        ctypes.memmove(why, msg, len(msg))
        return 1


_factory = _Factory(_make_communicator)  # alive for the process: the library keeps the pointer


def load():
    """Registers the C++ ops where libasynctp_torch.so is there and not turned off; True if it did."""
    global _ext, why_not
    if _ext is not None:
        return True
    if os.environ.get("ASYNCTP_TORCH_EXTENSION", "1") == "0":
        why_not = "ASYNCTP_TORCH_EXTENSION=0"
        return False
    where = path()
    if not where.exists():
        why_not = f"{where} is not there (built only where CMake's Python imports torch)"
        return False
    c = _lib.lib()
    torch.ops.load_library(str(where))
    ext = ctypes.CDLL(str(where))
    functions = _CFunctions(_lib.C_API_VERSION, *[ctypes.cast(getattr(c, "asynctp_" + name), _Fn).value for name in (
        "all_gather_matmul", "matmul_reduce_scatter", "refuse_call", "last_error", "comm_world_size", "comm_device")])
    if ext.asynctp_torch_init(ctypes.byref(functions)) != 0:
        raise _lib.Error(f"{where} was built for another version of asynctp's C interface than this package's "
                         f"({_lib.C_API_VERSION}): rebuild it with the library")
    ext.asynctp_torch_set_factory(_factory)
    ext.asynctp_torch_forget_group.argtypes = [ctypes.c_char_p]
    _ext, why_not = ext, ""
    return True


def forget(group):
    """Before `group`'s communicator is destroyed (None: every group's)."""
    if _ext is not None:
        _ext.asynctp_torch_forget_group(group.encode() if group is not None else None)
