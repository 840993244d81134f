"""How a group's communicator is chosen, without a GPU: why a group's own NCCL communicator is not
shared (here: a fake process group), and the ranks' agreement on it through the store."""

import threading

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: the communicator choice is not tested here")
dist = pytest.importorskip("torch.distributed")

from asynctp import comm  # noqa: E402


def test_a_group_without_pytorchs_nccl_backend_says_why_it_is_not_shared():
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        ptr, why = comm.process_group_nccl(dist.group.WORLD)
    finally:
        dist.destroy_process_group()
    assert ptr is None
    assert why == "its CUDA backend is FakeProcessGroup, not PyTorch's ProcessGroupNCCL"


def test_every_rank_reads_every_ranks_answer():
    store = dist.HashStore()
    answers = {}

    def rank(r, mine):
        answers[r] = comm._agree(store, "k", r, 3, mine)

    threads = [threading.Thread(target=rank, args=(r, w)) for r, w in enumerate(["", "no NCCL here", ""])]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert answers == {r: ["", "no NCCL here", ""] for r in range(3)}


def test_a_shared_communicator_hands_its_abort_to_the_library_as_a_live_c_callback(monkeypatch):
    """The watchdog calls the process group's abort() through the C function pointer passed to
    asynctp_comm_wrap; an exception in it is logged, never raised into C; the pointer stays valid."""
    import ctypes

    from asynctp import _lib

    passed = {}

    def fake_call(name, *args):
        passed[name] = args

    monkeypatch.setattr(_lib, "call", fake_call)
    calls = []
    comm.Communicator(0, 2, None, 0, nccl_comm=0x1234, on_overdue=lambda: calls.append("abort"))
    nccl, _timeout, _cache, callback, arg, _out = passed["comm_wrap"]
    assert nccl.value == 0x1234 and arg is None
    assert ctypes.cast(callback, ctypes.c_void_p).value, "on_overdue went to the library as NULL"
    assert callback in comm._callbacks, "the callback is not kept alive for the library"
    callback(None)
    assert calls == ["abort"]

    def failing():
        raise RuntimeError("abort failed")

    comm.Communicator(0, 2, None, 0, nccl_comm=0x1234, on_overdue=failing)
    passed["comm_wrap"][3](None)  # logged, not raised

    comm.Communicator(0, 2, None, 0, nccl_comm=0x1234)
    assert not ctypes.cast(passed["comm_wrap"][3], ctypes.c_void_p).value, "no on_overdue must go as NULL"


def test_ranks_as_threads_without_the_in_process_transports_environment_are_refused_by_name(monkeypatch):
    # PyTorch's threaded process group gets the in-process transport, which needs two variables set
    # before CUDA starts; without them each rank is refused, before anything touches a GPU.
    from torch.testing._internal.distributed import multi_threaded_pg

    monkeypatch.delenv("CUDA_MODULE_LOADING", raising=False)
    errors = {}
    store = dist.HashStore()

    def rank_main(rank):
        dist.init_process_group("threaded", rank=rank, world_size=2, store=store)
        assert comm._threaded(dist.group.WORLD)
        try:
            comm.communicator()
        except comm._lib.Error as e:
            errors[rank] = str(e)

    torch._C._distributed_c10d._set_thread_isolation_mode(True)
    multi_threaded_pg._install_threaded_pg()
    try:
        threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
    finally:
        multi_threaded_pg._uninstall_threaded_pg()
        torch._C._distributed_c10d._set_thread_isolation_mode(False)
    assert sorted(errors) == [0, 1]
    for rank, message in errors.items():
        assert message.startswith(f"rank {rank}: group "), message
        assert "CUDA_MODULE_LOADING=EAGER and CUDA_DEVICE_MAX_CONNECTIONS=32" in message, message
