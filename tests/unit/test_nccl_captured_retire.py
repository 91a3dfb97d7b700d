"""A communicator that ever had a call captured into a CUDA graph is never destroyed or aborted:
NCCL's destroy and abort (``commDestroySync``) poll until every graph holding its persistent
plans is destroyed, which a close, an abort or the process's exit cannot wait for. The fakes
raise where NCCL would hang (``FakeComm.persistent_refs``). And an abort never runs NCCL under
the transport's lock: its frees wait for the whole device, and every new call would wait too."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from denseccl.transport import _ABANDONED
from denseccl.errors import DenseCCLError
from denseccl.ops import ReduceOp
from denseccl.streams import StreamRef
from tests.unit.test_nccl_fakes import S, WouldHang, make
from tests.unit.test_nccl_transport import F32


def _capture_a_call(transport, cuda):
    cuda.alive.add(88)
    cuda.capturing.add(88)
    transport.allreduce(1, 1, 4, F32, ReduceOp.SUM, StreamRef(88, "cupy", 0))
    cuda.capturing.discard(88)  # end_capture: the graph lives on, holding the plan


def test_fake_fails_where_nccl_hangs():
    transport, comm, cuda, _ = make(size=2)
    _capture_a_call(transport, cuda)
    assert comm.persistent_refs == 1
    with pytest.raises(WouldHang, match="would hang"):
        comm.destroy()
    comm._graphs_destroyed()
    comm.destroy()
    assert comm.destroyed  # once the graphs are gone NCCL destroys it


def test_close_after_a_capture_retires(caplog):
    transport, comm, cuda, _ = make(size=2)
    _capture_a_call(transport, cuda)
    transport.allreduce(1, 1, 4, F32, ReduceOp.SUM, S)  # eager work after the capture, completed
    with caplog.at_level(logging.INFO, logger="denseccl"):
        transport.close()
    assert not comm.destroyed and not comm.aborted and comm.hung is None and comm.persistent_refs == 1
    assert "retired" in caplog.text and any(comm in kept for kept in _ABANDONED)  # never collected either
    with pytest.raises(DenseCCLError, match="closed"):
        transport.allreduce(1, 1, 4, F32, ReduceOp.SUM, S)


def test_abort_after_a_capture_keeps_the_communicator():
    transport, comm, cuda, _ = make(size=2, timeout=0.2)
    _capture_a_call(transport, cuda)
    transport.abort("a peer is gone")
    assert not comm.aborted and comm.hung is None and transport.failure() == "a peer is gone"
    with pytest.raises(DenseCCLError, match="a peer is gone"):
        transport.allreduce(1, 1, 4, F32, ReduceOp.SUM, S)
    transport.close()  # nothing left to do, and no hang


def test_abort_runs_outside_the_transport_lock():
    """ncclCommAbort waits for the device (another communicator's stuck kernel holds it): while
    it waits, another thread's call must be refused at once, not queue behind the lock."""
    transport, comm, cuda, _ = make(size=2)
    inside, release = threading.Event(), threading.Event()
    held = []

    def abort_waits():
        held.append(transport._lock.locked())
        inside.set()
        release.wait(10)

    comm.abort_waits = abort_waits
    aborter = threading.Thread(target=transport.abort, args=("watchdog: timed out",))
    aborter.start()
    try:
        assert inside.wait(5)
        started = time.monotonic()
        with pytest.raises(DenseCCLError, match="timed out"):
            transport.allreduce(1, 1, 4, F32, ReduceOp.SUM, S)
        assert time.monotonic() - started < 1.0 and held == [False]
    finally:
        release.set()
        aborter.join(10)
    assert comm.aborted
