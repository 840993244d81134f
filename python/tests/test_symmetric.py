"""asynctp.symmetric without a GPU: a region of memory becomes a tensor on the device named, over the
same bytes (not a copy), and what owns the memory stays alive exactly as long as a tensor over it."""

import ctypes
import gc
import weakref

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: asynctp.symmetric is not tested here")

from asynctp import symmetric  # noqa: E402


class _Owner:
    def __init__(self, n):
        self.memory = (ctypes.c_uint8 * n)(*range(n))


def test_a_region_is_a_tensor_over_the_same_bytes_that_keeps_its_owner_alive():
    owner = _Owner(64)
    ptr = ctypes.addressof(owner.memory)
    t = symmetric._device_bytes(ptr, 64, torch.device("cpu"), owner)
    assert t.dtype == torch.uint8 and t.shape == (64,) and t.device.type == "cpu"
    assert t.data_ptr() == ptr
    assert t[:4].tolist() == [0, 1, 2, 3]
    t[5] = 200
    assert owner.memory[5] == 200, "the tensor is a copy, not a view"
    assert t.view(torch.int32)[0].item() == 0x03020100
    gone = weakref.ref(owner)
    del owner
    gc.collect()
    assert gone() is not None, "the owner went while a tensor over its memory lived"
    del t
    gc.collect()
    assert gone() is None, "the owner outlived every tensor over its memory"
