"""libasynctp_c.so through ctypes: the C interface of include/asynctp/c_api.h, and its errors as
asynctp.Error. Needs no PyTorch."""

import ctypes
import os
import pathlib
import threading

C_API_VERSION = 8  # ASYNCTP_C_API_VERSION this module was written for
MAX_DIMS = 6
UNIQUE_ID_BYTES = 128

# Enum values of c_api.h.
DTYPE_BF16, DTYPE_FP16, DTYPE_FP32, DTYPE_FP8E4M3, DTYPE_FP8E5M2 = 0, 1, 2, 3, 4
ALGORITHMS = {"sequential": 0, "pipelined": 1, "fused": 2, "auto": 3}
ROW_MAJOR, COL_MAJOR = 0, 1
REDUCE_OPS = {"sum": 0, "avg": 1}


class Error(RuntimeError):
    """An error from asynctp; the message is the C++ library's asynctp::Error, unchanged."""


_Dims = ctypes.c_int64 * MAX_DIMS


class Tensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("dtype", ctypes.c_int32),
        ("ndim", ctypes.c_int32),
        ("shape", _Dims),
        ("strides", _Dims),
    ]

    @classmethod
    def of(cls, data_ptr, dtype, shape, strides):
        n = len(shape)
        if n > MAX_DIMS:
            raise Error(f"a tensor of {n} dims; asynctp takes at most {MAX_DIMS}")
        return cls(data_ptr, dtype, n, _Dims(*shape), _Dims(*strides))


class OpOptions(ctypes.Structure):
    _fields_ = [
        ("algorithm", ctypes.c_int32),
        ("b_layout", ctypes.c_int32),
        ("check_across_ranks", ctypes.c_int32),
        ("chunks_per_rank", ctypes.c_int32),
        ("check_pointers", ctypes.c_int32),
    ]


class WaitContext(ctypes.Structure):
    """asynctp_wait_context: what a kernel's bounded wait needs (asynctp/device/signals.cuh)."""

    _fields_ = [
        ("fault", ctypes.c_void_p),
        ("timeout_ns", ctypes.c_uint64),
        ("rank", ctypes.c_int32),
        ("unused", ctypes.c_int32),
    ]


class SymmetricInfo(ctypes.Structure):
    _fields_ = [
        ("buffer", ctypes.c_void_p),
        ("bytes", ctypes.c_uint64),
        ("buffer_ptrs_dev", ctypes.c_void_p),
        ("signal_pad", ctypes.c_void_p),
        ("signal_pad_ptrs_dev", ctypes.c_void_p),
        ("signal_count", ctypes.c_int32),
        ("rank", ctypes.c_int32),
        ("world_size", ctypes.c_int32),
        ("unused", ctypes.c_int32),
        ("wait", WaitContext),
    ]


_Comm = ctypes.c_void_p
# asynctp_comm_wrap's on_overdue: void (*)(void* arg), called on a thread of the library's.
OnOverdue = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_Sym = ctypes.c_void_p
_int_p = ctypes.POINTER(ctypes.c_int)
_SIGNATURES = {
    "asynctp_c_api_version": ([], ctypes.c_int),
    "asynctp_version_string": ([], ctypes.c_char_p),
    "asynctp_last_error": ([], ctypes.c_char_p),
    "asynctp_op_options_default": ([ctypes.POINTER(OpOptions)], None),
    "asynctp_get_unique_id": ([ctypes.c_char_p], ctypes.c_int),
    "asynctp_comm_create": (
        [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_char_p,
         ctypes.POINTER(_Comm)],
        ctypes.c_int,
    ),
    "asynctp_comm_wrap": ([ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p, OnOverdue, ctypes.c_void_p,
                           ctypes.POINTER(_Comm)], ctypes.c_int),
    "asynctp_nccl_versions": ([_int_p, _int_p], ctypes.c_int),
    "asynctp_comm_destroy": ([_Comm], ctypes.c_int),
    "asynctp_in_process_group_create": ([ctypes.c_int, ctypes.POINTER(ctypes.c_int), ctypes.c_int,
                                         ctypes.POINTER(ctypes.c_void_p)], ctypes.c_int),
    "asynctp_in_process_group_destroy": ([ctypes.c_void_p], ctypes.c_int),
    "asynctp_comm_create_in_process": ([ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int,
                                        ctypes.POINTER(_Comm)], ctypes.c_int),
    "asynctp_comm_rank": ([_Comm, _int_p], ctypes.c_int),
    "asynctp_comm_world_size": ([_Comm, _int_p], ctypes.c_int),
    "asynctp_comm_device": ([_Comm, _int_p], ctypes.c_int),
    "asynctp_all_gather_matmul": (
        [_Comm, ctypes.POINTER(Tensor), ctypes.POINTER(Tensor), ctypes.c_int, ctypes.c_int,
         ctypes.POINTER(Tensor), ctypes.POINTER(Tensor), ctypes.c_void_p, ctypes.POINTER(OpOptions)],
        ctypes.c_int,
    ),
    "asynctp_matmul_reduce_scatter": (
        [_Comm, ctypes.POINTER(Tensor), ctypes.POINTER(Tensor), ctypes.c_int, ctypes.c_int,
         ctypes.POINTER(Tensor), ctypes.c_void_p, ctypes.POINTER(OpOptions)],
        ctypes.c_int,
    ),
    "asynctp_all_gather_scaled_matmul": (
        [_Comm, ctypes.POINTER(Tensor), ctypes.POINTER(Tensor), ctypes.c_int, ctypes.POINTER(Tensor),
         ctypes.POINTER(Tensor), ctypes.c_int, ctypes.POINTER(Tensor), ctypes.POINTER(Tensor), ctypes.c_void_p,
         ctypes.POINTER(OpOptions), ctypes.c_int, ctypes.POINTER(Tensor), ctypes.POINTER(Tensor)],
        ctypes.c_int,
    ),
    "asynctp_scaled_matmul_reduce_scatter": (
        [_Comm, ctypes.POINTER(Tensor), ctypes.POINTER(Tensor), ctypes.POINTER(Tensor), ctypes.POINTER(Tensor),
         ctypes.c_int, ctypes.c_int, ctypes.POINTER(Tensor), ctypes.c_void_p, ctypes.POINTER(OpOptions), ctypes.c_int,
         ctypes.POINTER(Tensor), ctypes.POINTER(Tensor)],
        ctypes.c_int,
    ),
    "asynctp_refuse_call": ([_Comm, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_int], ctypes.c_int),
    "asynctp_comm_synchronize": ([_Comm, ctypes.c_void_p], ctypes.c_int),
    "asynctp_symmetric_create": ([_Comm, ctypes.c_uint64, ctypes.c_int, ctypes.POINTER(_Sym)], ctypes.c_int),
    "asynctp_symmetric_destroy": ([_Sym], ctypes.c_int),
    "asynctp_symmetric_get_info": ([_Sym, ctypes.POINTER(SymmetricInfo)], ctypes.c_int),
    "asynctp_symmetric_peer": ([_Sym, ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_void_p)],
                               ctypes.c_int),
    "asynctp_symmetric_put_signal": ([_Sym, ctypes.c_int, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p],
                                     ctypes.c_int),
    "asynctp_symmetric_wait_signal": ([_Sym, ctypes.c_int, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p],
                                      ctypes.c_int),
    "asynctp_symmetric_barrier": ([_Sym, ctypes.c_void_p], ctypes.c_int),
}

_lock = threading.Lock()
_lib = None
_path = None


def _candidates():
    """Where libasynctp_c.so is looked for, in order."""
    env = os.environ.get("ASYNCTP_LIBRARY")
    if env:
        return [pathlib.Path(env)]
    here = pathlib.Path(__file__).resolve().parent
    # A wheel puts it beside this file; a source tree (PYTHONPATH=python) finds it in build/.
    return [here / "libasynctp_c.so", here.parent.parent / "build" / "libasynctp_c.so"]


def _preload_pip_nccl():
    """Loads the NCCL of the nvidia-nccl wheel (PyTorch's) before asynctp, so that both share one.

    libasynctp_c.so asks for libnccl.so.2 by name; a library of that name already in the process is
    reused. Without this, a process that has not imported torch yet could load the system's NCCL, and
    asynctp refuses an NCCL other than the one it was built with."""
    try:
        import nvidia.nccl  # noqa: PLC0415 (optional)
    except ImportError:
        return
    for root in getattr(nvidia.nccl, "__path__", []):
        lib = pathlib.Path(root) / "lib" / "libnccl.so.2"
        if lib.exists():
            ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
            return


def lib():
    """The loaded library (loaded on first use)."""
    global _lib, _path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        tried = _candidates()
        found = next((p for p in tried if p.exists()), None)
        if found is None:
            raise Error(
                "libasynctp_c.so not found (looked at " + ", ".join(map(str, tried)) + "): build it "
                "with scripts/setup.sh, install the package (pip install .), or set ASYNCTP_LIBRARY to its path")
        _preload_pip_nccl()
        loaded = ctypes.CDLL(str(found))
        for name, (args, res) in _SIGNATURES.items():
            fn = getattr(loaded, name)
            fn.argtypes = args
            fn.restype = res
            _functions[name[len("asynctp_"):]] = fn
        got = loaded.asynctp_c_api_version()
        if got != C_API_VERSION:
            raise Error(f"{found} has C API version {got}; this asynctp package needs {C_API_VERSION}: "
                        "rebuild the library from the same source tree as the package")
        _lib, _path = loaded, found
        return _lib


def library_path():
    lib()
    return _path


_functions = {}  # "all_gather_matmul" -> asynctp_all_gather_matmul, filled by lib()


def call(name, *args):
    """Calls asynctp_<name>; a failure raises Error with the library's message."""
    fn = _functions.get(name)
    if fn is None:
        lib()  # fills _functions
        fn = _functions[name]
    if fn(*args) != 0:
        raise Error(_lib.asynctp_last_error().decode("utf-8", "replace"))


def version():
    return lib().asynctp_version_string().decode()


def nccl_versions():
    """(the NCCL loaded in this process, the NCCL the library was built with), as NCCL_VERSION_CODE."""
    runtime, build = ctypes.c_int(), ctypes.c_int()
    call("nccl_versions", ctypes.byref(runtime), ctypes.byref(build))
    return runtime.value, build.value


def default_options():
    o = OpOptions()
    lib().asynctp_op_options_default(ctypes.byref(o))
    return o


def options(algorithm, b_layout, chunks_per_rank, check_across_ranks=True, check_pointers=True):
    """OpOptions without a call into the library (the ops build one per call)."""
    return OpOptions(algorithm, b_layout, 1 if check_across_ranks else 0, chunks_per_rank, 1 if check_pointers else 0)


def unique_id():
    buf = ctypes.create_string_buffer(UNIQUE_ID_BYTES)
    call("get_unique_id", buf)
    return buf.raw
