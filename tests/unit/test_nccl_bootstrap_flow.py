"""init(backend="nccl") end to end on the CPU, with CuPy and NCCL replaced by fakes: the unique
id travels over a real TCPStore (explicit store=, and the torchrun-style environment) or MPI,
every rank builds its communicator with the same id in CuPy's form, the agreement check runs on
the host channel, and a second init on the same store gets its own namespace."""

from __future__ import annotations

import threading
import types
from datetime import timedelta

import numpy as np
import pytest

import denseccl
from denseccl.backends.nccl import init as nccl_bootstrap
from denseccl.backends import rendezvous
from denseccl.errors import MismatchError
from denseccl.backends.nccl import transport as nccl_transport
from denseccl.backends.nccl.tables import version_code
from denseccl.backends.store import SoloControl, StoreControl
from denseccl.channel.shared import SharedControl
from denseccl.wait import WAITING
from tests.unit.test_nccl_fakes import FakeComm, FakeCuda
from tests.unit.test_nccl_transport import HostCAI
from tests.support.optional import has_mpi4py, needs_mpi4py

if has_mpi4py:
    from denseccl.backends.mpi.transport import MPIControl


@pytest.fixture()
def torch_distributed():
    """torch.distributed, for the tests that need its TCPStore (the others run without torch)."""
    return pytest.importorskip("torch.distributed")


class FakeNccl(types.SimpleNamespace):
    def __init__(self) -> None:
        super().__init__()
        self.made = []
        self._lock = threading.Lock()
        self._counter = 0

    def get_unique_id(self):
        with self._lock:
            self._counter += 1
            return bytes([self._counter]) * 128

    def get_version(self):
        return version_code(2, 27, 3)

    def NcclCommunicator(self, ndev, commId, rank):  # noqa: N802 - CuPy's names
        size, unique_id = ndev, commId
        if not isinstance(unique_id, bytes):
            raise TypeError("Argument 'commId' has incorrect type")
        with self._lock:
            self.made.append((size, unique_id, rank))
        return FakeComm(rank, size)


@pytest.fixture()
def fakes(monkeypatch):
    nccl = FakeNccl()
    cupy = types.SimpleNamespace(
        __version__="14.2.0",
        cuda=types.SimpleNamespace(
            runtime=types.SimpleNamespace(getDeviceCount=lambda: 2), Device=FakeCuda().module.cuda.Device
        ),
    )
    monkeypatch.setattr(nccl_bootstrap, "_require_nccl", lambda: (cupy, nccl))
    monkeypatch.setattr(nccl_transport, "CudaStreams", lambda device: FakeCuda().streams(device))
    monkeypatch.setattr(denseccl.arrays, "_cuda_device_of_pointer", lambda pointer: 0)
    monkeypatch.setattr(denseccl.streams, "current_stream_pointer", lambda library, device: 0)
    # ranks as threads share device 0, as ranks with their own NCCL_HOSTID may (one host each for NCCL)
    real = nccl_bootstrap.device_identity
    monkeypatch.setattr(
        nccl_bootstrap, "device_identity",
        lambda cupy, device: real(cupy, device, {"NCCL_HOSTID": f"thread-{threading.get_ident()}"}),
    )
    return nccl


@pytest.fixture(autouse=True)
def waiting_policy(monkeypatch):
    """Threads sharing a board judge this process crowded (wait.WAITING): undone after each test."""
    monkeypatch.setattr(WAITING, "crowded", WAITING.crowded)
    monkeypatch.setattr(WAITING, "doorbells", WAITING.doorbells)


def _in_threads(size, body):
    results, errors = [None] * size, []

    def run(rank):
        try:
            results[rank] = body(rank)
        except BaseException as error:  # noqa: BLE001
            errors.append((rank, error))

    threads = [threading.Thread(target=run, args=(r,)) for r in range(size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    return results


def test_explicit_store_three_ranks(fakes, torch_distributed):
    server = torch_distributed.TCPStore("127.0.0.1", 0, 4, True, timeout=timedelta(seconds=30), wait_for_workers=False)

    def body(rank):
        store = torch_distributed.TCPStore("127.0.0.1", server.port, 4, False, timeout=timedelta(seconds=30))
        comms = [denseccl.init(backend="nccl", store=store, rank=rank, size=3, device=0, timeout=20) for _ in range(2)]
        first = comms[0]
        assert (first.backend, first.rank, first.size, first.transport.device) == ("nccl", rank, 3, 0)
        # the threads share this host: the agreement on its board, the rest over the store
        assert isinstance(first.control, SharedControl) and isinstance(first.control.inner, StoreControl)
        assert first.control.inner.prefix != comms[1].control.inner.prefix
        ok = HostCAI(np.zeros((2, 3), np.float32))
        assert first.allreduce(ok) is ok  # every rank agrees: the (fake) NCCL call runs
        odd = HostCAI(np.zeros((2, 3), np.float32) if rank else np.zeros((2, 3), np.float32).T.copy().T)
        try:
            first.allreduce(odd)  # rank 0 holds another layout: every rank raises
        except MismatchError as error:
            return str(error)
        return "no error"

    outcomes = _in_threads(3, body)
    assert len(fakes.made) == 6
    assert len({uid for _, uid, _ in fakes.made}) == 2  # two communicators, one id each, shared by its ranks
    for outcome in outcomes:
        assert "mismatch" in outcome and "layout" in outcome, outcome


def test_torchrun_environment(fakes, monkeypatch, torch_distributed):
    from tests.gpu.support import free_port

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    monkeypatch.setattr(rendezvous, "_STORES", {})  # the env:// store cache
    first = denseccl.init(backend="nccl", timeout=10)
    second = denseccl.init(backend="nccl", timeout=10)  # reuses the store: its server holds the port
    assert first.size == 1 and first.transport.device == 1  # LOCAL_RANK 3 modulo 2 GPUs
    assert isinstance(first.control, StoreControl) and first.control.prefix != second.control.prefix
    monkeypatch.setattr(denseccl.arrays, "_cuda_device_of_pointer", lambda pointer: 1)
    x = HostCAI(np.arange(4, dtype=np.float32))
    assert first.allreduce(x) is x


def test_single_rank_without_launcher(fakes):
    comm = denseccl.init(backend="nccl", size=1, timeout=5)
    assert isinstance(comm.control, SoloControl) and comm.size == 1
    assert comm.transport.comm.calls[0][0] == "allReduce"  # the fail-early barrier
    comm.close()
    assert comm.transport.comm.destroyed


@needs_mpi4py
def test_mpi_launch(fakes):
    from mpi4py import MPI

    comm = denseccl.init(backend="nccl", comm=MPI.COMM_WORLD, timeout=5)
    assert isinstance(comm.control, MPIControl) and comm.size == MPI.COMM_WORLD.Get_size()
    assert comm.transport.device == 0  # local rank 0 modulo 2
    comm.close()


def test_cupy13_takes_a_tuple(fakes, monkeypatch):
    made = []

    def tuple_only(ndev, commId, rank):
        if not isinstance(commId, tuple):
            raise TypeError("Argument 'commId' has incorrect type (expected tuple)")
        made.append(commId)
        return FakeComm(rank, ndev)

    fakes.NcclCommunicator = tuple_only
    cupy, nccl = nccl_bootstrap._require_nccl()
    cupy13 = types.SimpleNamespace(**{**vars(cupy), "__version__": "13.6.0"})
    monkeypatch.setattr(nccl_bootstrap, "_require_nccl", lambda: (cupy13, nccl))
    comm = denseccl.init(backend="nccl", size=1, timeout=5)
    assert len(made) == 1 and len(made[0]) == 128 and all(-128 <= v <= 127 for v in made[0])
    comm.close()
