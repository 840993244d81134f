"""Symmetric memory for kernels of one's own: a tensor every rank of a group allocates at once and
every rank can address, with a pad of uint32 signal flags beside it.

    buf = asynctp.symmetric.empty(4096, 1024, dtype=torch.bfloat16)   # collective
    h = asynctp.symmetric.rendezvous(buf)
    peer = h.get_buffer((h.rank + 1) % h.world_size, (4096, 1024), torch.bfloat16)
    peer.copy_(x)                       # the copy engine writes the peer's memory
    h.put_signal((h.rank + 1) % h.world_size, index=0, value=step)
    h.wait_signal(h.rank, index=0, value=step)   # bounded by the communicator's timeout

Kernels get the pointer arrays (buffer_ptrs_dev, signal_pad_ptrs_dev) and, for CUDA kernels that
include asynctp/device/signals.cuh, the wait context. Flags hold values compared modulo 2^32 (a waiter
waits for flag >= value), so a flag never needs resetting: give each use a larger value, an epoch.
PyTorch's put_signal/wait_signal set a flag to 1 and reset it as they wait; these do not reset.

The memory stays until close() (collective) or the group's communicator ends (asynctp.shutdown);
tensors over it must not be used after that. docs/reference/symmetric_memory.md has the details.
"""

import ctypes
import math

import torch
import torch.utils.dlpack

from . import _lib, comm

DEFAULT_SIGNAL_COUNT = 256


# A region of device memory as a torch tensor, made through DLPack, which names the device itself: the
# CUDA array interface would ask CUDA which device owns the pointer, and a peer's buffer is the peer's
# memory, so torch would place (or copy) the tensor there rather than on this rank's device.
class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32), ("dtype", _DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(_DLManagedTensor))
_DLManagedTensor._fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _DELETER)]
_KDL_DEVICE = {"cpu": 1, "cuda": 2}
_KDL_UINT = 1
_alive = {}  # address of a managed tensor handed to torch -> what it needs until torch lets it go


@_DELETER
def _release(managed):
    _alive.pop(ctypes.addressof(managed.contents), None)


_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


def _device_bytes(ptr, nbytes, device, owner):
    """`nbytes` bytes at `ptr` as a uint8 tensor on `device` (a torch.device), keeping `owner` alive
    while the tensor is."""
    shape = (ctypes.c_int64 * 1)(nbytes)
    managed = _DLManagedTensor()
    where = _DLDevice(_KDL_DEVICE[device.type], device.index or 0)
    managed.dl_tensor = _DLTensor(ptr, where, 1, _DLDataType(_KDL_UINT, 8, 1), shape, None, 0)
    managed.deleter = _release
    _alive[ctypes.addressof(managed)] = (managed, shape, owner)
    return torch.utils.dlpack.from_dlpack(_capsule_new(ctypes.addressof(managed), b"dltensor", None))


class SymmetricMemory:
    """One rank's handle of a symmetric buffer and its signal pad (asynctp_symmetric in the C API)."""

    def __init__(self, communicator, nbytes, signal_count):
        """Collective over the communicator's ranks, with the same nbytes and signal_count."""
        handle = ctypes.c_void_p()
        _lib.call("symmetric_create", communicator.handle, nbytes, signal_count, ctypes.byref(handle))
        self._handle = handle
        self._comm = communicator
        info = _lib.SymmetricInfo()
        _lib.call("symmetric_get_info", handle, ctypes.byref(info))
        self.rank, self.world_size = info.rank, info.world_size
        self.device = torch.device("cuda", communicator.device)
        self.buffer_size = info.bytes
        self.signal_count = info.signal_count
        self.buffer_ptrs_dev = info.buffer_ptrs_dev
        self.signal_pad_ptrs_dev = info.signal_pad_ptrs_dev
        self.wait_context = info.wait  # asynctp_wait_context, for kernels of asynctp/device/signals.cuh
        self.buffer_ptrs, self.signal_pad_ptrs = [], []
        for r in range(self.world_size):
            buf, pad = ctypes.c_void_p(), ctypes.c_void_p()
            _lib.call("symmetric_peer", handle, r, ctypes.byref(buf), ctypes.byref(pad))
            self.buffer_ptrs.append(buf.value)
            self.signal_pad_ptrs.append(pad.value)
        communicator.symmetric.append(self)

    @property
    def handle(self):
        if self._handle is None:
            raise _lib.Error(f"rank {self.rank}: this symmetric memory was closed")
        return self._handle

    def _view(self, ptr, region_bytes, what, sizes, dtype, storage_offset):
        if isinstance(sizes, int):
            sizes = (sizes,)
        sizes = tuple(int(s) for s in sizes)
        if any(s < 0 for s in sizes) or storage_offset < 0:
            raise _lib.Error(f"{what}: sizes {sizes} and storage_offset {storage_offset} must not be negative")
        itemsize = torch.empty((), dtype=dtype).element_size()
        end = (storage_offset + math.prod(sizes)) * itemsize
        if end > region_bytes:
            raise _lib.Error(f"{what}: {sizes} of {dtype} at element {storage_offset} end at byte {end}; the "
                             f"region has {region_bytes} bytes")
        raw = _device_bytes(ptr, region_bytes, self.device, self)
        return raw.view(dtype)[storage_offset:storage_offset + math.prod(sizes)].view(sizes)

    def _check_rank(self, rank, what):
        if not 0 <= rank < self.world_size:
            raise _lib.Error(f"{what}: rank {rank}; expected 0 to {self.world_size - 1}")

    def get_buffer(self, rank, sizes, dtype, storage_offset=0):
        """Rank `rank`'s buffer as a tensor of `sizes` and `dtype`, from element `storage_offset`."""
        self._check_rank(rank, "get_buffer")
        self.handle  # noqa: B018 (refuses a closed handle)
        return self._view(self.buffer_ptrs[rank], self.buffer_size, "get_buffer", sizes, dtype, storage_offset)

    def get_signal_pad(self, rank, sizes=None, dtype=torch.int32, storage_offset=0):
        """Rank `rank`'s signal pad as a tensor (default: all its flags, as int32 of the same bits)."""
        self._check_rank(rank, "get_signal_pad")
        self.handle  # noqa: B018
        if sizes is None:
            sizes = (self.signal_count * 4 // torch.empty((), dtype=dtype).element_size(),)
        return self._view(self.signal_pad_ptrs[rank], self.signal_count * 4, "get_signal_pad", sizes, dtype,
                          storage_offset)

    def _stream(self, stream):
        return ctypes.c_void_p((stream if stream is not None else torch.cuda.current_stream(self.device)).cuda_stream)

    def barrier(self, stream=None):
        """Stream-ordered: work after it on `stream` (default: the current one) starts once every rank's
        work before its own barrier has finished. Bounded by the communicator's timeout."""
        _lib.call("symmetric_barrier", self.handle, self._stream(stream))

    def put_signal(self, owner, index=0, value=1, stream=None):
        """Stream-ordered: once earlier work on `stream` is done, flag `index` of rank `owner`'s pad := value."""
        _lib.call("symmetric_put_signal", self.handle, owner, index, value & 0xFFFFFFFF, self._stream(stream))

    def wait_signal(self, owner, index=0, value=1, stream=None):
        """Stream-ordered: later work on `stream` waits until flag `index` of rank `owner`'s pad is at
        least `value` (modulo 2^32). Past the communicator's timeout the wait ends, and the next
        synchronize (asynctp.communicator(group).synchronize()) raises asynctp.Error with the report."""
        _lib.call("symmetric_wait_signal", self.handle, owner, index, value & 0xFFFFFFFF, self._stream(stream))

    def close(self):
        """Collective: frees the memory on every rank. Tensors over it must not be used after."""
        if self._handle is not None:
            handle, self._handle = self._handle, None
            self._comm.symmetric.remove(self)
            _lib.call("symmetric_destroy", handle)


def empty(*size, dtype=torch.bfloat16, group=None, signal_count=DEFAULT_SIGNAL_COUNT):
    """Collective over `group` (None: the default group): a tensor of `size` and `dtype` on the current
    CUDA device in a new symmetric buffer (zeroed), with `signal_count` signal flags beside it."""
    if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
        size = tuple(size[0])
    c = comm.communicator(group)
    itemsize = torch.empty((), dtype=dtype).element_size()
    nbytes = max(1, math.prod(size)) * itemsize
    h = SymmetricMemory(c, nbytes, signal_count)
    return h.get_buffer(h.rank, size, dtype)


def rendezvous(tensor, group=None):
    """The handle of the symmetric buffer that holds `tensor` (made by empty() on `group`). Local: the
    buffer was made collectively already."""
    c = comm.communicator(group)
    ptr = tensor.data_ptr()
    for h in c.symmetric:
        base = h.buffer_ptrs[h.rank]
        if base <= ptr < base + h.buffer_size:
            return h
    raise _lib.Error(f"rendezvous: the tensor at {ptr:#x} is not in a symmetric buffer of this group "
                     "(make it with asynctp.symmetric.empty)")
