"""What a third reading of CuPy 14.2 and NCCL 2.28.9 predicted, on the CPU with the fakes
(tests/unit/test_nccl_fakes.py, as strict as the library where these cases need it):

- close() never blocks past the communicator's timeout while its kernels run (ncclCommDestroy
  would wait for them): it aborts, or with no timeout retires;
- no event query while a capture seen on the device runs, by any poller (the flow's dropped
  Works, ``Work.is_completed``, the torch adapter's progress thread);
- a capture stream destroyed after its capture does not pause the watchdogs for good;
- ncclInProgress (7), which CuPy cannot name (KeyError), is read as what it is.
"""

from __future__ import annotations

import logging
import threading
import time

import numpy as np
import pytest

from denseccl import arrays, streams
from denseccl.backends.nccl import init as nccl_init
from denseccl.backends.nccl import tables
from denseccl.backends.store import SoloControl
from denseccl.communicator import Communicator
from denseccl.dtypes import DTYPES
from denseccl.errors import CollectiveTimeoutError, CommunicatorBrokenError
from denseccl.ops import ReduceOp
from denseccl.streams import StreamRef
from tests.unit.test_nccl_fakes import NcclError, S, make
from tests.unit.test_nccl_transport import HostCAI, wait_for

F32 = DTYPES["float32"]
FOREVER = 120.0  # a peer that never comes: the kernel runs until it is aborted


@pytest.fixture()
def solo(monkeypatch):
    """A one-rank Communicator (timeout 1 s) on the fake transport, current stream 55."""
    monkeypatch.setattr(arrays, "_cuda_device_of_pointer", lambda pointer: 0)
    monkeypatch.setattr(streams, "current_stream_pointer", lambda library, device: 55)
    transport, fake, cuda, _ = make(size=1, current=55, timeout=1.0)
    communicator = Communicator(transport, SoloControl(), timeout=1.0)
    communicator.fake, communicator.cuda = fake, cuda
    yield communicator
    communicator.close()


def _close_within(close, seconds):
    """Run ``close`` in a thread: (returned in time, seconds it took)."""
    started = time.monotonic()
    thread = threading.Thread(target=close, daemon=True)
    thread.start()
    thread.join(seconds)
    return not thread.is_alive(), time.monotonic() - started


# -- close() and work in flight ---------------------------------------------------------------------


def test_the_fake_destroy_waits_for_the_kernels_of_the_communicator():
    """What ncclCommDestroy does (commDestroySync synchronizes NCCL's stream, which waits for
    the kernels enqueued): the fake too, so that a close under running kernels hangs here."""
    transport, comm, cuda, _ = make()
    gate = cuda.block(S.pointer, FOREVER)
    transport.allreduce(1, 1, 4, F32, ReduceOp.SUM, S)
    destroyed, _ = _close_within(comm.destroy, 0.3)
    assert not destroyed and not comm.destroyed
    gate.set()
    assert wait_for(lambda: comm.destroyed)


@pytest.mark.parametrize("how", ["synchronous", "dropped work"])
def test_close_aborts_work_still_running_at_the_timeout(how, solo, caplog):
    x = HostCAI(np.ones(4, np.float32))
    gate = solo.cuda.block(55, FOREVER)
    try:
        if how == "synchronous":
            solo.allreduce(x)  # returns once enqueued: the device waits
        else:
            solo.allreduce(x, async_op=True)  # dropped unwaited: the flow adopts it
        with caplog.at_level(logging.WARNING, logger="denseccl"):
            returned, took = _close_within(solo.close, 10)
        assert returned and took < 5, took  # the timeout (1 s) and the abort, not the kernel
        assert solo.fake.aborted and not solo.fake.destroyed
        assert "did not complete within 1 s" in solo.transport.failure()
        with pytest.raises(CommunicatorBrokenError):
            solo.allreduce(x)
    finally:
        gate.set()


def test_close_without_timeout_retires_work_still_running(caplog):
    transport, comm, cuda, _ = make(timeout=None, grace=0.3)
    gate = cuda.block(S.pointer, FOREVER)
    try:
        transport.allreduce(1, 1, 4, F32, ReduceOp.SUM, S)
        with caplog.at_level(logging.WARNING, logger="denseccl"):
            returned, took = _close_within(transport.close, 10)
        assert returned and took < 5, took
        assert not comm.destroyed and not comm.aborted  # kept for the process's life
        assert "kept for the process's life instead (retired)" in caplog.text
        assert transport._closed and transport.failure() is None
    finally:
        gate.set()


def test_close_during_a_capture_retires_instead_of_aborting(caplog):
    """While a capture runs on the device nothing may be asked of the eager work (the watchdog
    is paused too): close() cannot tell a late call from a finished one, and aborting could
    break the graph being captured, so it keeps the communicator."""
    transport, comm, cuda, _ = make(timeout=1.0)
    cuda.auto_done = False
    transport.allreduce(1, 1, 4, F32, ReduceOp.SUM, S)
    cuda.capture_mode = "relaxed"
    cuda.alive.add(88)
    cuda.capturing.add(88)
    transport.allreduce(1, 1, 4, F32, ReduceOp.SUM, StreamRef(88, "cupy", 0))  # the gate closes
    with caplog.at_level(logging.INFO, logger="denseccl"):
        returned, took = _close_within(transport.close, 10)
    assert returned and took < 5 and not comm.aborted and not comm.destroyed
    assert "captured into a CUDA graph" in caplog.text and "retired" in caplog.text and transport._closed


def test_close_destroys_once_the_work_completed():
    transport, comm, cuda, _ = make(timeout=5.0)
    gate = cuda.block(S.pointer, FOREVER)
    transport.allreduce(1, 1, 4, F32, ReduceOp.SUM, S)
    threading.Timer(0.2, gate.set).start()
    returned, took = _close_within(transport.close, 10)
    assert returned and comm.destroyed and not comm.aborted and transport.failure() is None


# -- no event query during a capture -------------------------------------------------------------


def test_dropped_work_is_not_polled_during_a_capture(solo):
    """Flow.run polls the dropped Works after every call: after a captured call that poll
    must not query the eager call's event (global mode: that invalidates the capture)."""
    x = HostCAI(np.ones(4, np.float32))
    solo.cuda.auto_done = False
    solo.allreduce(x, async_op=True)  # dropped: the flow keeps it
    solo.cuda.recorded[-1].finished = True
    assert solo.transport.wait_idle(5)  # the watchdog is done with it; the flow still holds it
    assert len(solo.flow.orphans) == 1
    solo.cuda.capturing.add(55)  # begin_capture
    before = solo.cuda.queries
    solo.allreduce(x)  # captured
    assert solo.cuda.invalidated == set() and solo.cuda.queries == before
    assert solo.allreduce(x, async_op=True).is_completed()  # a captured Work: never queried
    assert solo.cuda.invalidated == set()
    solo.cuda.capturing.clear()  # end_capture
    solo.allreduce(x)  # eager again: now the dropped Work is completed
    assert solo.flow.orphans == []


def test_is_completed_of_an_eager_work_during_a_capture_does_not_query(solo):
    x = HostCAI(np.ones(4, np.float32))
    solo.cuda.auto_done = False
    eager = solo.allreduce(x, async_op=True)
    solo.cuda.capture_mode = "relaxed"  # until a call has seen the capture
    solo.cuda.alive.add(88)
    solo.cuda.capturing.add(88)
    solo.allreduce(x, stream=88)  # captured on another stream: the device's gate closes
    solo.cuda.capture_mode = "global"
    assert wait_for(lambda: _quiet(solo.cuda))  # the watchdog's last poll has ended
    before = solo.cuda.queries
    assert not eager.is_completed()
    assert solo.cuda.queries == before and solo.cuda.invalidated == set()
    solo.cuda.capturing.clear()
    solo.cuda.recorded[0].finished = True
    assert wait_for(eager.is_completed)


def _quiet(cuda):
    before = cuda.queries
    time.sleep(0.1)
    return cuda.queries == before


def test_the_torch_progress_thread_does_not_query_during_a_capture(solo):
    """The torch adapter's progress thread polls ``is_completed()`` of the steps in flight: it
    too must leave a global-mode capture alone."""
    torch = pytest.importorskip("torch")
    from denseccl.torch.progress import Operation, Progress

    x = HostCAI(np.ones(4, np.float32))
    solo.cuda.auto_done = False
    work = solo.allreduce(x, async_op=True)
    solo.cuda.capture_mode = "relaxed"
    solo.cuda.alive.add(88)
    solo.cuda.capturing.add(88)
    solo.allreduce(x, stream=88)
    solo.cuda.capture_mode = "global"
    assert wait_for(lambda: _quiet(solo.cuda))
    progress = Progress("denseccl-test")
    operation = Operation("allreduce", [work], lambda: "done", torch.futures.Future(), None)
    progress.submit(operation)
    time.sleep(0.3)  # the thread polls all along
    assert solo.cuda.invalidated == set() and not operation.done
    solo.cuda.capturing.clear()
    solo.cuda.recorded[0].finished = True
    assert operation.future.wait() == "done"
    assert progress.stop(5)


def _past_deadline_operation(solo):
    """An eager async allreduce on stream 55 whose kernel has not finished, for a progress
    thread, with its deadline already past."""
    torch = pytest.importorskip("torch")
    from denseccl.torch.progress import Operation, Progress

    x = HostCAI(np.ones(4, np.float32))
    solo.cuda.auto_done = False
    work = solo.allreduce(x, async_op=True)
    assert work.watched  # the NCCL watchdog times it out
    progress = Progress("denseccl-test")
    operation = Operation("allreduce", [work], lambda: "done", torch.futures.Future(), time.monotonic() - 1)
    return progress, operation


def test_the_progress_thread_past_a_deadline_leaves_a_capture_alone(solo):
    """Past an operation's deadline the progress thread used to wait on the step to raise the
    timeout; on an NCCL step that orders the thread's stream after the call (no timeout at all),
    which a global-mode capture forbids. The watchdog's verdict alone may fail a device step."""
    progress, operation = _past_deadline_operation(solo)
    solo.cuda.capture_mode = "relaxed"
    solo.cuda.alive.add(88)
    solo.cuda.capturing.add(88)
    solo.allreduce(HostCAI(np.ones(4, np.float32)), stream=88)  # captured: the device's gate closes
    solo.cuda.capture_mode = "global"
    assert wait_for(lambda: _quiet(solo.cuda))
    solo.cuda.current_pointer = 0  # the progress thread's stream: torch's default in a thread of its own
    waits, queries = list(solo.cuda.waits), solo.cuda.queries
    progress.submit(operation)
    time.sleep(0.3)  # the thread polls all along, past the deadline
    assert solo.cuda.waits == waits and solo.cuda.queries == queries and solo.cuda.invalidated == set()
    assert not operation.done and solo.broken is None
    solo.cuda.recorded[0].finished = True
    solo.cuda.capturing.clear()  # end_capture: the call is judged again, and has completed
    assert operation.future.wait() == "done"
    assert progress.stop(5)


def test_the_progress_thread_past_a_deadline_fails_a_device_step_by_the_watchdog(solo):
    """Outside a capture too: a device step past its deadline fails with the watchdog's
    timeout (the communicator aborted), rather than completing by ordering a stream."""
    progress, operation = _past_deadline_operation(solo)
    solo.cuda.current_pointer = 0
    progress.submit(operation)
    with pytest.raises(CollectiveTimeoutError, match="did not complete within 1 s"):
        operation.future.wait()
    assert solo.fake.aborted and solo.cuda.waits == []
    assert progress.stop(5)


# -- a destroyed capture stream -------------------------------------------------------------------


def test_a_destroyed_capture_stream_does_not_pause_the_watchdog():
    """A CuPy user captures on a temporary stream, ends the capture and frees the stream before
    any watchdog looked again: CUDA then refuses that handle, which must not read as a capture
    that still runs (the watchdogs of the device would never act again)."""
    transport, comm, cuda, _ = make(timeout=0.3)
    cuda.alive.add(88)
    cuda.capturing.add(88)
    transport.allreduce(1, 1, 4, F32, ReduceOp.SUM, StreamRef(88, "cupy", 0))  # captured: seen
    cuda.capturing.discard(88)  # end_capture
    cuda.alive.discard(88)  # the stream is destroyed
    assert not transport.events.capture_in_progress()
    cuda.auto_done = False
    transport.allreduce(1, 1, 4, F32, ReduceOp.SUM, S)  # never completes
    assert wait_for(lambda: transport.failure() is not None, 5)  # its timeout counts again
    assert "did not complete within 0.3 s" in transport.failure()
    assert not comm.aborted  # a graph captured a call on it: kept, as ncclCommAbort would wait for the graph


def test_an_invalidated_capture_still_counts():
    transport, _, cuda, _ = make()
    cuda.alive.add(88)
    cuda.capturing.add(88)
    transport.allreduce(1, 1, 4, F32, ReduceOp.SUM, StreamRef(88, "cupy", 0))
    cuda.invalidated.add(88)  # is_capturing raises until end_capture
    assert transport.events.capture_in_progress()
    cuda.invalidated.clear()
    cuda.capturing.clear()
    assert not transport.events.capture_in_progress()
    transport.close()


def test_the_fake_refuses_streams_that_do_not_exist():
    _, _, cuda, _ = make()
    runtime = cuda.module.cuda.runtime
    assert runtime.streamIsCapturing(S.pointer) is False
    with pytest.raises(RuntimeError, match="cudaErrorInvalidResourceHandle") as raised:
        runtime.streamIsCapturing(4242)
    assert raised.value.status == 400


# -- ncclInProgress ---------------------------------------------------------------------------------


def test_the_fake_ncclerror_has_cupys_table():
    for status in range(7):
        assert NcclError(status).status == status
    with pytest.raises(KeyError):
        NcclError(7)


def test_cupys_ncclerror_cannot_name_in_progress():
    """What the fake copies: CuPy 14.2 builds NcclError(7) with ERROR2[7], a KeyError."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cupy_nccl = pytest.importorskip("cupy.cuda.nccl")
    if not getattr(cupy_nccl, "available", False):
        pytest.skip("CuPy cannot load libnccl here")
    assert cupy_nccl.NcclError(6).status == 6
    with pytest.raises(KeyError) as raised:
        cupy_nccl.NcclError(7)
    assert tables.nccl_status(raised.value) == tables.NCCL_IN_PROGRESS


def test_in_progress_from_a_collective_is_named():
    transport, comm, _, _ = make()
    comm.fail_status = 7
    named = r"ncclInProgress \(7\).*non-blocking.*NCCL_COMM_BLOCKING"
    with pytest.raises(tables.NCCLStatusError, match=named) as raised:
        transport.allreduce(1, 1, 4, F32, ReduceOp.SUM, S)
    assert raised.value.status == 7 and not isinstance(raised.value, KeyError)
    comm.fail_status = 4  # the statuses CuPy names are still read from NcclError
    with pytest.raises(Exception, match="NCCL refused the arguments"):
        transport.allreduce(1, 1, 4, F32, ReduceOp.SUM, S)
    transport.close()


def test_in_progress_as_the_asynchronous_error_is_no_error():
    """ncclCommGetAsyncError answers ncclInProgress while a (non-blocking) operation runs:
    not an error, and no reason to abort."""
    transport, comm, _, _ = make()
    comm.check_async_error = lambda: (_ for _ in ()).throw(_cupy_error(7))
    assert transport.async_error() is None
    comm.check_async_error = lambda: (_ for _ in ()).throw(_cupy_error(6))
    assert "asynchronous error" in transport.async_error()
    transport.close()


def _cupy_error(status):
    """What CuPy raises for ``status``: its NcclError, or the KeyError of building one."""
    try:
        return NcclError(status)
    except KeyError as error:
        return error


def test_in_progress_at_init_says_what_to_do():
    def factory(size, unique_id, rank):
        raise _cupy_error(7)

    with pytest.raises(tables.NCCLStatusError, match="NCCL_COMM_BLOCKING"):
        nccl_init.make_communicator(factory, 2, bytes(128), 0, "14.2.0")


def test_nccl_status_reads_only_cupys_errors():
    assert tables.nccl_status(NcclError(4)) == 4
    assert tables.nccl_status(KeyError(7)) == 7
    assert tables.nccl_status(KeyError("7")) is None and tables.nccl_status(KeyError(99)) is None
    assert tables.nccl_status(ValueError(7)) is None
