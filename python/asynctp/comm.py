"""An asynctp communicator per torch.distributed process group.

The first op on a group makes its communicator, collectively. Where the group is PyTorch's NCCL process
group, its NCCL communicator is made already and runs on the NCCL asynctp was built with, asynctp uses
that communicator (no second one: less GPU memory, no second NCCL set-up). Otherwise the group's rank 0
makes an NCCL unique id and passes it to the others through the group's store, every rank creates an
NCCL communicator of asynctp's own on the current CUDA device, and a log line of logger "asynctp" says
why. Every rank takes the same way: they agree through the store. The communicator lives until
shutdown() (collective; before torch.distributed.destroy_process_group, which ends a shared NCCL
communicator) or the process ends.

Where the group is PyTorch's threaded test process group (ranks as threads of one process, as
torch.testing's multi-threaded tests make), each rank's communicator is one of asynctp's in-process
transport (asynctp/in_process.h), every rank on the current CUDA device: multi-rank code tested on one
GPU. It needs CUDA_MODULE_LOADING=EAGER and CUDA_DEVICE_MAX_CONNECTIONS=32 set before the process's first
CUDA call."""

import collections
import ctypes
import logging
import os
import sys
import threading

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from . import _extension, _lib

_comms = {}  # group name -> Communicator; (group name, rank) for a threaded group's ranks
_in_process_groups = {}  # threaded group name -> [asynctp_group handle, its live communicators]
# How many communicators each group has had: ranks make and destroy them together, so the count names
# the same store key on every rank, and a group's second communicator never reads its first one's id.
_made = collections.Counter()
_lock = threading.Lock()
_log = logging.getLogger("asynctp")


class Communicator:
    """One rank's asynctp::Communicator (see include/asynctp/communicator.h)."""

    def __init__(self, rank, world_size, unique_id, device, timeout_ms=0, tuning_cache=None, *, nccl_comm=None,
                 on_overdue=None, in_process_group=None):
        """An NCCL communicator of asynctp's own from `unique_id`, or, where `nccl_comm` (an ncclComm_t
        as an int) is given, one that uses that communicator, which the caller keeps alive; then
        on_overdue() is called, on a thread of the library's, when a call is overdue on the GPU (an NCCL
        kernel waiting on a peer that is gone), for the caller to abort that communicator. With
        `in_process_group` (an asynctp_group), rank `rank`'s communicator of that group: every rank's
        thread makes its own at once."""
        handle = ctypes.c_void_p()
        cache = tuning_cache.encode() if tuning_cache else None
        if in_process_group is not None:
            _lib.call("comm_create_in_process", in_process_group, rank, timeout_ms, cache, 0, ctypes.byref(handle))
        elif nccl_comm is None:
            _lib.call("comm_create", rank, world_size, unique_id, device, timeout_ms, cache, ctypes.byref(handle))
        else:
            callback = _on_overdue_callback(on_overdue) if on_overdue is not None else _lib.OnOverdue()
            _lib.call("comm_wrap", ctypes.c_void_p(nccl_comm), timeout_ms, cache, callback, None, ctypes.byref(handle))
        self._handle = handle
        self.rank, self.world_size, self.device = rank, world_size, device
        self.shares_nccl_comm = nccl_comm is not None  # the process group's own NCCL communicator
        self.symmetric = []  # live asynctp.symmetric.SymmetricMemory on it, closed before it ends

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
        """Collective: every rank of the group calls it. Closes its symmetric memory first."""
        while self.symmetric:
            self.symmetric[-1].close()
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


def process_group_nccl(pg):
    """(the ncclComm_t of `pg`'s own NCCL communicator, as an int, "") where asynctp can use it on this
    rank, else (None, why not)."""
    try:
        backend = pg._get_backend(torch.device("cuda"))
    except (RuntimeError, ValueError) as e:
        return None, f"the group has no CUDA backend ({e})"
    if not hasattr(backend, "_comm_ptr"):
        return None, f"its CUDA backend is {type(backend).__name__}, not PyTorch's ProcessGroupNCCL"
    runtime, build = _lib.nccl_versions()
    if runtime != build:
        return None, f"the NCCL loaded here ({runtime}) is not the one asynctp was built with ({build})"
    theirs = torch.cuda.nccl.version()
    theirs = theirs[0] * 10000 + theirs[1] * 100 + theirs[2] if isinstance(theirs, tuple) else int(theirs)
    if theirs != runtime:
        return None, f"PyTorch's NCCL ({theirs}) is not the one loaded here ({runtime})"
    ptr = backend._comm_ptr()
    if not ptr:
        return None, ("its NCCL communicator is not made yet: torch.distributed.init_process_group(device_id=...) "
                      "makes it at once")
    return ptr, ""


# The callbacks given to the library stay alive for the process: its watchdog may call one on a thread
# of its own after the communicator is gone.
_callbacks = []


def _on_overdue_callback(fn):
    """fn() as asynctp_comm_wrap's on_overdue, its exceptions logged (none may cross into C)."""
    def call(_arg):
        try:
            fn()
        except Exception:  # noqa: BLE001
            _log.exception("asynctp: the process group's abort, called by the watchdog, failed")
    callback = _lib.OnOverdue(call)
    _callbacks.append(callback)
    return callback


def _agree(store, key, rank, size, mine):
    """Every rank's `mine` (a short string), through the store."""
    store.set(f"{key}/{rank}", mine)
    return [bytes(store.get(f"{key}/{r}")).decode() for r in range(size)]


def communicator(group=None, *, timeout_ms=0, tuning_cache=None, share_nccl=True):
    """The communicator of `group` (None: the default group; a ProcessGroup or its name), made on
    first use on the current CUDA device. Collective on first use. share_nccl=False makes an NCCL
    communicator of asynctp's own even where the group's could be used."""
    if isinstance(group, str):  # the ops' path: one dict lookup once made
        comm = _comms.get(group)
        if comm is not None:
            return comm
    pg = _group(group)
    name = pg.group_name
    if _threaded(pg):
        return _in_process_communicator(pg, name, timeout_ms, tuning_cache)
    with _lock:
        comm = _comms.get(name)
        if comm is not None:
            return comm
        rank, size = pg.rank(), pg.size()
        store = c10d._get_process_group_store(pg)
        prefix = f"asynctp/{name}/{_made[name]}"
        _made[name] += 1
        nccl_comm, why = process_group_nccl(pg) if share_nccl else (None, "share_nccl=False")
        answers = _agree(store, f"{prefix}/share", rank, size, why if nccl_comm is None else "")
        refused = [(r, w) for r, w in enumerate(answers) if w]
        if not refused:
            # An asynctp call overdue on the GPU (an NCCL kernel waiting on a peer that is gone) ends
            # only when the NCCL communicator is aborted: its owner, the process group, does that.
            abort = getattr(pg, "abort", None)
            if abort is None:
                _log.info("asynctp: this PyTorch's process group has no abort(): an asynctp call on group %r "
                          "waiting on a peer that is gone is not ended by asynctp's watchdog", name)
            comm = Communicator(rank, size, None, torch.cuda.current_device(), timeout_ms, tuning_cache,
                                nccl_comm=nccl_comm, on_overdue=abort)
            _comms[name] = comm
            return comm
        r, w = refused[0]
        _log.info("asynctp: group %r gets an NCCL communicator of asynctp's own, not the process group's: "
                  "on rank %d, %s", name, r, w)
        key = f"{prefix}/nccl_id"
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


def _threaded(pg):
    """Whether `pg` is PyTorch's threaded test process group (looked for only where it was imported)."""
    threaded = sys.modules.get("torch.testing._internal.distributed.multi_threaded_pg")
    return threaded is not None and isinstance(pg, threaded.ProcessLocalGroup)


def _in_process_communicator(pg, name, timeout_ms, tuning_cache):
    rank, size = pg.rank(), pg.size()
    comm = _comms.get((name, rank))
    if comm is not None:
        return comm
    if os.environ.get("CUDA_MODULE_LOADING") != "EAGER" or os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS") != "32":
        raise _lib.Error(f"rank {rank}: group {name!r} is PyTorch's threaded process group, whose ranks get asynctp's "
                         "in-process transport; it needs CUDA_MODULE_LOADING=EAGER and CUDA_DEVICE_MAX_CONNECTIONS=32 "
                         "set before the process's first CUDA call (asynctp/in_process.h says why)")
    device = torch.cuda.current_device()
    with _lock:
        entry = _in_process_groups.get(name)
        if entry is None:
            handle = ctypes.c_void_p()
            _lib.call("in_process_group_create", size, (ctypes.c_int * 1)(device), 1, ctypes.byref(handle))
            entry = _in_process_groups[name] = [handle, 0]
        entry[1] += 1
    # Outside the lock: every rank's thread makes its communicator at once.
    try:
        comm = Communicator(rank, size, None, device, timeout_ms, tuning_cache, in_process_group=entry[0])
    except BaseException:
        _release_in_process_group(name)
        raise
    _comms[(name, rank)] = comm
    return comm


def _release_in_process_group(name):
    with _lock:
        entry = _in_process_groups[name]
        entry[1] -= 1
        if entry[1] == 0:  # every rank's communicator is gone
            del _in_process_groups[name]
            _lib.call("in_process_group_destroy", entry[0])


def _mine(key):
    """Whether the communicator `_comms[key]` is this thread's to destroy: any but another rank's of a
    threaded group."""
    if not isinstance(key, tuple):
        return True
    name, rank = key
    try:
        return c10d._resolve_process_group(name).rank() == rank
    except (RuntimeError, ValueError):  # the group is gone on this thread
        return False


def shutdown(group=None):
    """Destroys the communicator of `group` (every group's where None). Collective; call it before
    torch.distributed.destroy_process_group. A rank of a threaded group destroys its own."""
    name = None if group is None else group_name(group)
    keys = [key for key in list(_comms) if (name is None or (key[0] if isinstance(key, tuple) else key) == name)
            and _mine(key)]
    for key in keys:
        comm = _comms.pop(key, None)
        if comm is None:
            continue
        of = key[0] if isinstance(key, tuple) else key
        _extension.forget(of)  # the C++ ops ask for the group's communicator again
        comm.destroy()  # collective: outside the lock, where a threaded group's ranks meet
        if isinstance(key, tuple):
            _release_in_process_group(of)
