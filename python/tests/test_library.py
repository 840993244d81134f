"""libasynctp_c.so through ctypes, without PyTorch or a GPU: loading, versions, and errors arriving as
asynctp.Error with the C++ library's message."""

import ctypes
import pathlib
import re

import pytest

import asynctp
from asynctp import _lib


def test_loads_and_reports_the_project_version():
    cmake = (pathlib.Path(__file__).resolve().parents[2] / "CMakeLists.txt").read_text()
    project_version = re.search(r"project\(asynctp VERSION (\d+\.\d+\.\d+)", cmake).group(1)
    assert asynctp.version() == project_version
    assert asynctp.library_path().name == "libasynctp_c.so"


def test_option_defaults_are_the_cpp_defaults():
    o = _lib.default_options()
    assert (o.algorithm, o.b_layout, o.check_across_ranks, o.chunks_per_rank) == (
        _lib.ALGORITHMS["sequential"], _lib.ROW_MAJOR, 1, 0)


def test_options_built_in_python_match_the_librarys_defaults():
    a, b = _lib.default_options(), _lib.options(_lib.ALGORITHMS["sequential"], _lib.ROW_MAJOR, 0)
    assert [getattr(a, f) for f, _ in _lib.OpOptions._fields_] == [getattr(b, f) for f, _ in _lib.OpOptions._fields_]


def test_a_null_communicator_is_an_error_naming_the_function():
    rank = ctypes.c_int(-7)
    with pytest.raises(asynctp.Error, match=r"^asynctp_comm_rank: comm is NULL \(never created, or destroyed\)$"):
        _lib.call("comm_rank", None, ctypes.byref(rank))
    assert rank.value == -7  # nothing written


def test_the_first_bad_argument_is_reported_and_destroying_null_succeeds():
    a = _lib.Tensor.of(None, 9, [4, 4], [4, 1])
    with pytest.raises(asynctp.Error, match="comm is NULL"):
        _lib.call("matmul_reduce_scatter", None, ctypes.byref(a), ctypes.byref(a), 0, 0, ctypes.byref(a), None, None)
    _lib.call("comm_destroy", None)  # destroying NULL is allowed, and succeeds


def test_create_refuses_a_missing_result_pointer():
    with pytest.raises(asynctp.Error, match=r"asynctp_comm_create: comm \(the result\) is NULL"):
        _lib.call("comm_create", 0, 2, b"\0" * _lib.UNIQUE_ID_BYTES, -1, 0, None, None)


def test_more_dims_than_the_c_view_holds_is_refused_in_python():
    with pytest.raises(asynctp.Error, match="at most 6"):
        _lib.Tensor.of(None, 0, [1] * 7, [1] * 7)


def test_ops_without_torch_say_they_need_it():
    try:
        import torch  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="needs PyTorch"):
            asynctp.all_gather_matmul  # noqa: B018
    else:
        pytest.skip("PyTorch is installed here, so the ops load")


def test_symmetric_memory_calls_refuse_handles_that_are_not_live():
    info = _lib.SymmetricInfo()
    with pytest.raises(asynctp.Error, match=r"^asynctp_symmetric_get_info: sym is NULL"):
        _lib.call("symmetric_get_info", None, ctypes.byref(info))
    bogus = ctypes.c_void_p(0x1000)
    with pytest.raises(asynctp.Error, match=r"asynctp_symmetric_put_signal: sym is not a live symmetric memory handle"):
        _lib.call("symmetric_put_signal", bogus, 0, 0, 1, None)
    with pytest.raises(asynctp.Error, match=r"asynctp_symmetric_destroy: sym is not a live symmetric memory handle"):
        _lib.call("symmetric_destroy", bogus)
    _lib.call("symmetric_destroy", None)  # destroying NULL is allowed
    with pytest.raises(asynctp.Error, match=r"asynctp_symmetric_create: sym \(the result\) is NULL"):
        _lib.call("symmetric_create", None, 4096, 8, None)
    with pytest.raises(asynctp.Error, match=r"asynctp_symmetric_create: comm is NULL"):
        _lib.call("symmetric_create", None, 4096, 8, ctypes.byref(ctypes.c_void_p()))


def test_the_symmetric_info_struct_is_laid_out_as_the_c_header_says():
    # asynctp_symmetric_info in c_api.h: 5 pointer-sized fields, 4 int32, then the 24-byte wait context.
    assert ctypes.sizeof(_lib.WaitContext) == 24
    assert _lib.SymmetricInfo.wait.offset == 5 * 8 + 4 * 4
    assert ctypes.sizeof(_lib.SymmetricInfo) == 5 * 8 + 4 * 4 + 24
