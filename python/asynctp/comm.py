"""An asynctp communicator per torch.distributed process group.

The first op on a group makes its communicator, collectively: the group's rank 0 makes an NCCL unique
id and passes it to the others through the group's store; every rank then creates its communicator on
the current CUDA device. The communicator lives until shutdown() (collective) or the process ends."""

import collections
import ctypes
import threading

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from . import _lib

_comms = {}  # group name -> Communicator
# How many communicators each group has had: ranks make and destroy them together, so the count names
# the same store key on every rank, and a group's second communicator never reads its first one's id.
_made = collections.Counter()
_lock = threading.Lock()


class Communicator:
    """One rank's asynctp::Communicator (see include/asynctp/communicator.h)."""

    def __init__(self, rank, world_size, unique_id, device, timeout_ms=0, tuning_cache=None):
        handle = ctypes.c_void_p()
        cache = tuning_cache.encode() if tuning_cache else None
        _lib.call("comm_create", rank, world_size, unique_id, device, timeout_ms, cache, ctypes.byref(handle))
        self._handle = handle
        self.rank, self.world_size, self.device = rank, world_size, device

    @property
    def handle(self):
        if self._handle is None:
            raise _lib.Error(f"rank {self.rank}: this asynctp communicator was destroyed (asynctp.shutdown)")
        return self._handle

    def synchronize(self, stream=None):
        """Waits for `stream` (default: the current one); a timed-out wait inside asynctp raises Error."""
        stream = stream if stream is not None else torch.cuda.current_stream(self.device)
        _lib.call("comm_synchronize", self.handle, ctypes.c_void_p(stream.cuda_stream))

    def destroy(self):
        """Collective: every rank of the group calls it."""
        if self._handle is not None:
            handle, self._handle = self._handle, None
            _lib.call("comm_destroy", handle)


def _group(group):
    """A ProcessGroup from None (the default group), a group, or a group name."""
    if group is None:
        if not dist.is_initialized():
            raise _lib.Error("asynctp needs torch.distributed: call torch.distributed.init_process_group first")
        return dist.group.WORLD
    if isinstance(group, str):
        return c10d._resolve_process_group(group)
    return group


def group_name(group=None):
    """The name torch.distributed knows `group` by (a name is returned as it is, which keeps
    torch.compile from tracing into the process group's lookup)."""
    return group if isinstance(group, str) else _group(group).group_name


def communicator(group=None, *, timeout_ms=0, tuning_cache=None):
    """The communicator of `group` (None: the default group; a ProcessGroup or its name), made on
    first use on the current CUDA device. Collective on first use."""
    if isinstance(group, str):  # the ops' path: one dict lookup once made
        comm = _comms.get(group)
        if comm is not None:
            return comm
    pg = _group(group)
    name = pg.group_name
    with _lock:
        comm = _comms.get(name)
        if comm is not None:
            return comm
        rank, size = pg.rank(), pg.size()
        store = c10d._get_process_group_store(pg)
        key = f"asynctp/{name}/{_made[name]}/nccl_id"
        _made[name] += 1
        if rank == 0:
            uid = _lib.unique_id()
            store.set(key, uid)
        else:
            uid = bytes(store.get(key))
        if len(uid) != _lib.UNIQUE_ID_BYTES:
            raise _lib.Error(f"rank {rank}: the NCCL id read from the store of group {name!r} has {len(uid)} bytes; "
                             f"expected {_lib.UNIQUE_ID_BYTES}")
        comm = Communicator(rank, size, uid, torch.cuda.current_device(), timeout_ms, tuning_cache)
        _comms[name] = comm
        return comm


def shutdown(group=None):
    """Destroys the communicator of `group` (every group's where None). Collective; call it before
    torch.distributed.destroy_process_group."""
    with _lock:
        names = list(_comms) if group is None else [group_name(group)]
        for name in names:
            comm = _comms.pop(name, None)
            if comm is not None:
                comm.destroy()
