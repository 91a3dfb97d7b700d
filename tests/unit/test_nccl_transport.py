"""The NCCL transport's logic on the CPU, with the fakes of tests/unit/test_nccl_fakes.py (a fake
NcclCommunicator and a fake cupy, both checked against the installed CuPy) and a fake libnccl:
which call each collective makes (pointers, counts, dtypes, ops, roots, streams),
the PreMulSum op cache, Work/Pending semantics (stream wait vs host synchronisation), timeouts
that abort the communicator, asynchronous errors, the watchdog, split, and the Communicator on
top of it all. What only a GPU can show (NCCL's arithmetic, real streams) is in tests/gpu."""

from __future__ import annotations

import gc
import time
from types import SimpleNamespace

import numpy as np
import pytest

import denseccl
from denseccl import arrays, streams
from denseccl.communicator import Communicator
from denseccl.dtypes import DTYPES
from denseccl.errors import ArgumentError, CollectiveTimeoutError, CommunicatorBrokenError, DenseCCLError, OpError
from denseccl.ops import PreMulSum, ReduceOp
from denseccl.streams import StreamRef
from denseccl.backends.nccl import watchdog as nccl_watchdog
from denseccl.backends.nccl import tables as nccl_tables
from denseccl.backends.store import SoloControl
from tests.unit.test_nccl_fakes import COLLECTED, VERSION, S, make

F32, C64, BOOL, I16, F16 = (DTYPES[n] for n in ("float32", "complex64", "bool", "int16", "float16"))


def wait_for(predicate, seconds=5.0):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


# -- one call per collective ------------------------------------------------------------------


def test_calls_map_to_one_nccl_call_each():
    transport, comm, events, _ = make()
    transport.allreduce(100, 200, 10, F32, ReduceOp.SUM, S)
    transport.allreduce(100, 100, 10, C64, ReduceOp.AVG, S)
    transport.allreduce(100, 100, 8, BOOL, ReduceOp.SUM, S)
    transport.allreduce(100, 100, 8, BOOL, ReduceOp.PRODUCT, S)
    transport.reduce(100, 200, 3, F16, ReduceOp.MAX, 1, S)
    transport.broadcast(300, 5, I16, 1, S)
    transport.broadcast(300, 5, F32, 0, S)
    transport.allgather(100, 400, 6, F32, S)
    transport.reduce_scatter(400, 100, 6, C64, ReduceOp.SUM, S)
    assert comm.calls == [
        ("allReduce", 100, 200, 10, 7, 0, 77),
        ("allReduce", 100, 100, 20, 7, 4, 77),
        ("allReduce", 100, 100, 8, 1, 2, 77),
        ("allReduce", 100, 100, 8, 1, 3, 77),
        ("reduce", 100, 200, 3, 6, 2, 1, 77),
        ("broadcast", 300, 300, 10, 1, 1, 77),
        ("broadcast", 300, 300, 5, 7, 0, 77),
        ("allGather", 100, 400, 6, 7, 77),
        ("reduceScatter", 400, 100, 12, 7, 0, 77),
    ]
    assert [event.stream for event in events.recorded] == [77] * len(comm.calls)
    transport.close()
    assert comm.destroyed


def test_reducing_a_dtype_without_nccl_type_is_refused():
    transport, comm, _, _ = make()
    with pytest.raises(ArgumentError, match="int16"):
        transport.check_op(ReduceOp.SUM, I16)
    with pytest.raises(ArgumentError, match="int16"):
        transport.allreduce(1, 1, 1, I16, ReduceOp.SUM, S)
    with pytest.raises(OpError, match="pairs of reals"):
        transport.check_op(ReduceOp.PRODUCT, C64)
    assert comm.calls == []


@pytest.mark.parametrize("capability, reduces", [(80, False), (89, False), (90, True), (100, True)])
def test_fp8_reductions_only_from_sm90(capability, reduces):
    """NCCL >= 2.24 refuses fp8 reductions below sm90 (ncclInvalidArgument): refused before the
    call there, with the reason; broadcast and allgather still move fp8, as bytes."""
    transport, comm, _, _ = make(version=nccl_tables.version_code(2, 24), capability=str(capability))
    e4m3 = DTYPES["float8_e4m3fn"]
    if reduces:
        transport.allreduce(100, 100, 8, e4m3, ReduceOp.MAX, S)
        assert comm.calls[-1] == ("allReduce", 100, 100, 8, 10, 2, 77)
    else:
        with pytest.raises(ArgumentError, match=r"sm90.*cuda:0 is \d\.\d"):
            transport.allreduce(100, 100, 8, e4m3, ReduceOp.MAX, S)
        with pytest.raises(ArgumentError, match="sm90"):
            transport.check_op(ReduceOp.SUM, e4m3)
        assert comm.calls == []
    transport.broadcast(300, 5, e4m3, 0, S)
    transport.allgather(100, 400, 6, e4m3, S)
    code = 10 if reduces else 1  # ncclFloat8e4m3, or ncclUint8 bytes (one per element)
    assert comm.calls[-2:] == [("broadcast", 300, 300, 5, code, 0, 77), ("allGather", 100, 400, 6, code, 77)]
    assert transport.dtypes["float8_e4m3fn"] == code


def test_stream_forms():
    transport, comm, cuda, _ = make(current=55)
    cuda.alive |= {9, 10, 11, 12}
    transport.allreduce(1, 1, 1, F32, ReduceOp.SUM)  # None: CuPy's current stream
    transport.allreduce(1, 1, 1, F32, ReduceOp.SUM, 9)
    transport.allreduce(1, 1, 1, F32, ReduceOp.SUM, SimpleNamespace(ptr=10))
    transport.allreduce(1, 1, 1, F32, ReduceOp.SUM, SimpleNamespace(cuda_stream=11))
    transport.allreduce(1, 1, 1, F32, ReduceOp.SUM, SimpleNamespace(__cuda_stream__=lambda: (0, 12)))
    assert [call[-1] for call in comm.calls] == [55, 9, 10, 11, 12]
    with pytest.raises(ArgumentError, match="not a CUDA stream"):
        transport.allreduce(1, 1, 1, F32, ReduceOp.SUM, "default")


# -- PreMulSum ----------------------------------------------------------------------------------


def test_premul_ops_are_created_once_and_destroyed_on_close():
    transport, comm, _, library = make()
    for _ in range(3):
        transport.allreduce(1, 1, 4, F32, PreMulSum(0.5), S)
    transport.allreduce(1, 1, 4, C64, PreMulSum(0.5), S)  # complex scales through float32: same op
    transport.reduce_scatter(1, 2, 4, F16, PreMulSum(0.5), S)
    transport.reduce(1, 2, 4, F32, PreMulSum(2), 0, S)
    assert [created[:2] for created in library.created] == [
        (np.float32(0.5).tobytes(), 7),
        (np.float16(0.5).tobytes(), 6),
        (np.float32(2).tobytes(), 7),
    ]
    assert all(created[2] == 0x1234 for created in library.created)  # the raw ncclComm_t
    assert [call[5] for call in comm.calls] == [5, 5, 5, 5, 6, 7]
    transport.close()
    assert sorted(library.destroyed) == [(5, 0x1234), (6, 0x1234), (7, 0x1234)]


def test_premul_cache_is_bounded():
    transport, _, _, library = make()
    for i in range(70):
        transport.allreduce(1, 1, 1, F32, PreMulSum(1.0 + i), S)
    assert len(library.destroyed) == 6 and library.destroyed[0] == (5, 0x1234)
    transport.close()
    assert len(library.destroyed) == 70


# -- Pending: stream wait, host synchronisation, timeouts, async errors -------------------------


def test_wait_orders_the_current_stream_only_when_it_differs():
    transport, _, events, _ = make(current=77)
    transport.allreduce(1, 1, 1, F32, ReduceOp.SUM, S).wait(None)
    assert events.waits == []  # ran on the current stream: nothing to do
    events.current_pointer = 5
    pending = transport.allreduce(1, 1, 1, F32, ReduceOp.SUM, S)
    pending.wait(None)
    assert events.waits == [(5, events.recorded[-1])]


def test_wait_never_blocks_the_host():
    transport, _, events, _ = make(current=3)
    events.auto_done = False
    pending = transport.allreduce(1, 1, 1, F32, ReduceOp.SUM, S)
    started = time.monotonic()
    pending.wait(time.monotonic() + 0.01)  # a blocking wait would raise CollectiveTimeoutError here
    assert time.monotonic() - started < 5  # (a bound for a hang only: the machine may be loaded)
    assert not pending.test()
    events.recorded[-1].finished = True
    assert pending.test()
    pending.synchronize(time.monotonic() + 1)
    transport.close()


def test_synchronize_timeout_aborts():
    transport, comm, events, _ = make()
    events.auto_done = False
    pending = transport.allreduce(1, 1, 1, F32, ReduceOp.SUM, S)
    with pytest.raises(CollectiveTimeoutError, match="aborted"):
        pending.synchronize(time.monotonic() + 0.2)
    assert comm.aborted and "did not complete" in transport.failure()
    with pytest.raises(CollectiveTimeoutError):
        transport.allreduce(1, 1, 1, F32, ReduceOp.SUM, S)
    with pytest.raises(CollectiveTimeoutError):
        pending.wait(None)
    transport.close()
    assert not comm.destroyed  # an aborted communicator has nothing left to destroy


def test_async_error_is_raised_not_waited_out():
    transport, comm, events, _ = make()
    events.auto_done = False
    pending = transport.allreduce(1, 1, 1, F32, ReduceOp.SUM, S)
    comm.async_error = "NCCL_ERROR_REMOTE_ERROR: remote process exited"
    started = time.monotonic()
    with pytest.raises(CommunicatorBrokenError, match="asynchronous error.*remote process exited"):
        pending.synchronize(None)
    assert time.monotonic() - started < 5 and comm.aborted


def test_barrier_blocks_the_host():
    transport, comm, events, _ = make(current=8)
    pending = transport.barrier()
    assert comm.calls[-1] == ("allReduce", 0xBEEF, 0xBEEF, 1, 2, 0, 8)
    pending.wait(None)
    events.auto_done = False
    with pytest.raises(CollectiveTimeoutError):
        transport.barrier().wait(time.monotonic() + 0.1)


# -- the watchdog ------------------------------------------------------------------------------


def test_watchdog_aborts_a_collective_nobody_waits_for():
    transport, comm, events, _ = make(timeout=0.2)
    events.auto_done = False
    pending = transport.allreduce(1, 1, 1, F32, ReduceOp.SUM, S)
    pending.wait(None)  # the synchronous path: returns at once
    assert wait_for(lambda: comm.aborted)
    assert "did not complete within 0.2 s" in transport.failure()
    with pytest.raises(CollectiveTimeoutError):
        transport.allreduce(1, 1, 1, F32, ReduceOp.SUM, S)


def test_watchdog_reports_async_errors():
    transport, comm, events, _ = make(timeout=None)
    events.auto_done = False
    transport.allreduce(1, 1, 1, F32, ReduceOp.SUM, S)
    comm.async_error = "NCCL_ERROR_SYSTEM_ERROR"
    assert wait_for(lambda: comm.aborted)
    assert "SYSTEM_ERROR" in transport.failure()
    with pytest.raises(CommunicatorBrokenError):
        transport.allreduce(1, 1, 1, F32, ReduceOp.SUM, S)


def test_watchdog_drops_finished_and_cancelled_work():
    transport, comm, events, _ = make(timeout=0.3)
    for _ in range(20):
        transport.allreduce(1, 1, 1, F32, ReduceOp.SUM, S)
    comm.fail_next = RuntimeError("NCCL_ERROR_INVALID_ARGUMENT")
    with pytest.raises(RuntimeError):
        transport.allreduce(1, 1, 1, F32, ReduceOp.SUM, S)
    assert wait_for(lambda: transport._watchdog.in_flight == 0)
    time.sleep(0.5)  # past the timeout: nothing is late, so nothing is aborted
    assert transport.failure() is None and not comm.aborted
    transport.close()
    assert comm.destroyed


def test_watchdog_counts_a_blocked_enqueue():
    verdicts = []
    dog = nccl_watchdog.Watchdog(
        0.1, lambda event: True, lambda: None, lambda reason, late: verdicts.append((reason, late)), 0.01
    )
    dog.begin("allreduce")  # never armed: the enqueue call is still inside NCCL
    assert wait_for(lambda: verdicts)
    assert verdicts[0][1] is True and "allreduce" in verdicts[0][0]
    dog.close()


def test_watchdog_cuda_error_while_polling():
    transport, comm, events, _ = make(timeout=None)
    events.auto_done = False
    transport.allreduce(1, 1, 1, F32, ReduceOp.SUM, S)
    events.broken_query = True
    assert wait_for(lambda: comm.aborted)
    assert "checking NCCL work failed" in transport.failure() and "illegal memory access" in transport.failure()


def test_sticky_cuda_error_breaks_synchronize_and_test():
    """CuPy's Event.done reads a sticky error as "not done": waiting on it would time out (or,
    without a deadline, hang). The error is seen, the communicator aborted, and said why."""
    transport, comm, events, _ = make(timeout=None)
    events.auto_done = False
    pending = transport.allreduce(1, 1, 1, F32, ReduceOp.SUM, S)
    also = transport.allreduce(1, 1, 1, F32, ReduceOp.SUM, S)
    transport._watchdog.close()  # this test asks the pending calls themselves
    events.broken_query = True
    assert not events.recorded[-1].done  # CuPy's own answer: no error, just "not done"
    with pytest.raises(CommunicatorBrokenError, match="illegal memory access"):
        pending.synchronize(time.monotonic() + 5)
    assert comm.aborted and also.test()
    with pytest.raises(CommunicatorBrokenError, match="illegal memory access"):
        also.wait(None)


# -- retire: closing with work in flight --------------------------------------------------------


def test_retire_keeps_the_communicator_while_work_may_run():
    """Closing with a Work in flight retires the transport: nothing is destroyed under running
    kernels, and the CuPy communicator stays referenced (CuPy destroys it when collected)."""
    transport, comm, events, library = make(timeout=None)
    comm.name = "retired"
    events.auto_done = False
    transport.allreduce(1, 1, 1, F32, PreMulSum(0.5), S)
    transport.barrier()
    transport.retire()
    assert not comm.destroyed and not comm.aborted and library.destroyed == []
    with pytest.raises(DenseCCLError, match="closed"):
        transport.allreduce(1, 1, 1, F32, ReduceOp.SUM, S)
    transport.close()  # already retired: nothing more
    del transport, comm
    gc.collect()
    assert "retired" not in COLLECTED


def test_communicator_closed_with_work_in_flight_retires_its_transport(device_comm):
    device_comm.events.auto_done = False
    device_comm.fake.name = "in flight at close"
    work = device_comm.allreduce(HostCAI(np.zeros(3, np.float32)), async_op=True)
    device_comm.close()
    assert not device_comm.fake.destroyed and not work.is_completed()
    del work
    gc.collect()
    assert "in flight at close" not in COLLECTED


# -- split -------------------------------------------------------------------------------------


def test_split():
    transport, comm, _, _ = make(timeout=7.0)
    comm.split_size = 1
    part = transport.split(3, 1)
    assert comm.calls[-1] == ("commSplit", 3, 1)
    assert (part.size, part.device, part.timeout, part.version) == (1, 0, 7.0, VERSION)
    assert transport.split(None, 0) is None and comm.calls[-1] == ("commSplit", -1, 0)
    old, _, _, _ = make(version=nccl_tables.version_code(2, 17, 1))
    with pytest.raises(DenseCCLError, match="2.18"):
        old.split(0, 0)


# -- the Communicator over the NCCL transport ---------------------------------------------------


class HostCAI:
    """Host memory posing as device memory through __cuda_array_interface__."""

    def __init__(self, array: np.ndarray, stream=None) -> None:
        self.array = array
        self.__cuda_array_interface__ = {
            "shape": array.shape,
            "strides": array.strides,
            "typestr": array.dtype.str,
            "data": (array.ctypes.data, False),
            "version": 3,
            "stream": stream,
        }


@pytest.fixture()
def device_comm(monkeypatch):
    monkeypatch.setattr(arrays, "_cuda_device_of_pointer", lambda pointer: 0)
    monkeypatch.setattr(streams, "current_stream_pointer", lambda library, device: 55)
    transport, fake, events, library = make(size=1, current=55)
    events.alive |= {9, 66}  # the streams the tests below pass
    communicator = Communicator(transport, SoloControl(), timeout=5.0)
    communicator.fake = fake
    communicator.events = events
    yield communicator
    communicator.close()


def test_communicator_runs_spans_on_the_current_stream(device_comm):
    base = np.zeros((4, 3), np.float32)
    x = HostCAI(base.T[::-1])  # transposed and reversed: the span starts below the data pointer
    span_start = base.ctypes.data
    assert device_comm.allreduce(x, "avg") is x
    assert device_comm.fake.calls[-1] == ("allReduce", span_start, span_start, 12, 7, 4, 55)
    assert device_comm.events.waits == []
    work = device_comm.allreduce(x, denseccl.PreMulSum(0.25), async_op=True, stream=SimpleNamespace(ptr=66))
    assert device_comm.fake.calls[-1][-1] == 66
    assert work.is_completed()
    assert work.wait() is x
    assert device_comm.events.waits == [(55, device_comm.events.recorded[-1])]  # current stream waits
    assert work.synchronize() is x


def test_communicator_uses_the_interface_stream(device_comm):
    x = HostCAI(np.zeros(5, np.float64), stream=9)
    device_comm.broadcast(x, 0)
    assert device_comm.fake.calls[-1] == ("broadcast", x.array.ctypes.data, x.array.ctypes.data, 5, 8, 0, 9)


def test_interface_legacy_stream_is_handle_zero(device_comm):
    x = HostCAI(np.zeros(5, np.float64), stream=1)  # cudaStreamLegacy
    device_comm.broadcast(x, 0)
    assert device_comm.fake.calls[-1][-1] == 0
    assert streams.current_stream(arrays.as_buffer(HostCAI(np.zeros(2), stream=None))).pointer == 55


def test_torch_tensors_resolve_torchs_current_stream(monkeypatch):
    seen = []
    monkeypatch.setattr(streams, "current_stream_pointer", lambda library, device: seen.append((library, device)) or 7)
    buffer = arrays.Buffer(1, None, 0, "torch", False, None)
    assert streams.current_stream(buffer) == StreamRef(7, "torch", 0) and seen == [("torch", 0)]
    given = SimpleNamespace(cuda_stream=9)
    assert streams.current_stream(buffer, given) == StreamRef(9, "torch", 0, given)  # kept for torch's allocator
    assert streams.current_stream(buffer, 9) == StreamRef(9, "torch", 0)  # a bare handle: nothing to keep
    with pytest.raises(ArgumentError, match="not a CUDA stream"):
        streams.stream_pointer(True)


def test_communicator_allgather_and_reduce_scatter_with_out(device_comm):
    x = HostCAI(np.zeros((2, 3), np.complex64))
    out = HostCAI(np.zeros((1, 2, 3), np.complex64))
    assert device_comm.allgather(x, out=out) is out
    assert device_comm.fake.calls[-1] == ("allGather", x.array.ctypes.data, out.array.ctypes.data, 12, 7, 55)
    assert device_comm.reduce_scatter(out, "sum", out=x) is x
    assert device_comm.fake.calls[-1] == ("reduceScatter", out.array.ctypes.data, x.array.ctypes.data, 12, 7, 0, 55)


def test_communicator_refuses_before_calling_nccl(device_comm, monkeypatch):
    with pytest.raises(OpError, match="pairs of reals"):
        device_comm.allreduce(HostCAI(np.zeros(3, np.complex64)), "prod")
    with pytest.raises(ArgumentError, match="int16"):
        device_comm.allreduce(HostCAI(np.zeros(3, np.int16)), "sum")
    with pytest.raises(ArgumentError, match="host"):
        device_comm.allreduce(np.zeros(3, np.float32))
    with pytest.raises(ArgumentError, match="not a CUDA stream"):
        device_comm.allreduce(HostCAI(np.zeros(3, np.float32)), stream="s")
    with monkeypatch.context() as patch:
        patch.setattr(arrays, "_cuda_device_of_pointer", lambda pointer: 1)
        with pytest.raises(ArgumentError, match="cuda:1.*cuda:0"):
            device_comm.allreduce(HostCAI(np.zeros(3, np.float32)))
    assert device_comm.fake.calls == []
    device_comm.broadcast(HostCAI(np.zeros(3, np.int16)), 0)  # moved as bytes
    assert device_comm.fake.calls[-1][3:5] == (6, 1)


def test_communicator_broken_by_the_watchdog(device_comm):
    device_comm.events.auto_done = False
    device_comm.transport.abort("NCCL allreduce did not complete within 5 s", timed_out=True)
    with pytest.raises(CommunicatorBrokenError, match="did not complete"):
        device_comm.allreduce(HostCAI(np.zeros(3, np.float32)))


def test_communicator_work_synchronize_timeout(device_comm):
    device_comm.events.auto_done = False
    work = device_comm.allreduce(HostCAI(np.zeros(3, np.float32)), async_op=True)
    assert not work.is_completed()
    with pytest.raises(CollectiveTimeoutError):
        work.synchronize(timeout=0.1)
    assert device_comm.fake.aborted
    with pytest.raises(CommunicatorBrokenError, match="timed out"):
        device_comm.barrier()


def test_communicator_split(device_comm):
    part = device_comm.split(0, 0)
    assert isinstance(part, Communicator) and part.size == 1 and part.backend == "nccl"
    assert device_comm.split(None) is None
    with pytest.raises(ArgumentError):
        device_comm.split(-2)


def test_watchdog_binds_its_thread_first():
    import threading

    started, verdicts = [], []
    dog = nccl_watchdog.Watchdog(
        None, lambda event: True, lambda: None, lambda *v: verdicts.append(v), 0.01,
        lambda: started.append(threading.current_thread().name),
    )
    dog.begin("allreduce")
    assert wait_for(lambda: started) and started == ["denseccl-nccl-watchdog"]
    dog.close()
    broken = nccl_watchdog.Watchdog(
        None, lambda event: True, lambda: None, lambda *v: verdicts.append(v), 0.01, lambda: 1 / 0
    )
    broken.begin("allreduce")
    assert wait_for(lambda: verdicts) and "could not start" in verdicts[0][0]
    broken.close()
