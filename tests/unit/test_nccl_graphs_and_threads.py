"""What the first GPU run was predicted to hit, on the CPU with the fakes (tests/unit/test_nccl_fakes.py):

- one rank: fp8 avg / PreMulSum go to NCCL's host-side one-rank path, which has no fp8 case;
- an argument error NCCL reports before it enqueues anything must leave the communicator usable;
- CUDA graph capture: a captured call gets no watchdog entry and its event is never queried;
- ncclCommAbort / ncclCommDestroy never free the communicator under a call inside NCCL.
"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from denseccl import arrays, streams
from denseccl.communicator import Communicator
from denseccl.dtypes import DTYPES
from denseccl.errors import ArgumentError, CollectiveTimeoutError, CommunicatorBrokenError, DenseCCLError, OpError
from denseccl.ops import PreMulSum, ReduceOp, check_op_for_dtype
from denseccl.streams import StreamRef
from denseccl.backends.store import SoloControl
from denseccl.backends.nccl import transport as nccl
from tests.unit.test_nccl_fakes import FakeComm, FakeCuda, FakeLibrary, NcclError, S, make
from tests.unit.test_nccl_transport import HostCAI, wait_for

F32, E4M3, E5M2 = DTYPES["float32"], DTYPES["float8_e4m3fn"], DTYPES["float8_e5m2"]
FP8_VERSION = 23203  # NCCL 2.32.3


@pytest.fixture()
def solo(monkeypatch):
    """A one-rank Communicator on the fake transport (current stream 55)."""
    monkeypatch.setattr(arrays, "_cuda_device_of_pointer", lambda pointer: 0)
    monkeypatch.setattr(streams, "current_stream_pointer", lambda library, device: 55)
    transport, fake, cuda, library = make(size=1, current=55, version=FP8_VERSION)
    cuda.alive |= set(range(66, 71))  # the streams the tests pass
    communicator = Communicator(transport, SoloControl(), timeout=5.0)
    communicator.fake, communicator.cuda = fake, cuda
    yield communicator
    communicator.close()


# -- 1. one rank, fp8 ----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [E4M3, E5M2])
def test_one_rank_fp8_avg_and_unit_premul_run_as_sum(dtype):
    transport, comm, _, library = make(size=1, version=FP8_VERSION)
    transport.allreduce(100, 100, 8, dtype, ReduceOp.AVG, S)
    transport.reduce(100, 200, 8, dtype, ReduceOp.AVG, 0, S)
    transport.reduce_scatter(100, 200, 8, dtype, ReduceOp.AVG, S)
    transport.allreduce(100, 100, 8, dtype, PreMulSum(1.0), S)
    assert [call[5] for call in comm.calls] == [0, 0, 0, 0]  # ncclSum: one rank's sum is its input
    assert library.created == [] and transport.failure() is None
    with pytest.raises(OpError, match=r"PreMulSum\(0.5\).*one rank.*x.mul_"):
        transport.allreduce(100, 100, 8, dtype, PreMulSum(0.5), S)
    assert len(comm.calls) == 4 and transport.failure() is None
    transport.allreduce(100, 100, 8, dtype, ReduceOp.MAX, S)  # still usable
    assert comm.calls[-1][5] == 2


@pytest.mark.parametrize("size", [1, 2])
def test_gpu_matrix_asks_the_library_which_ops_run(size, monkeypatch):
    """tests/gpu/matrix.py on one rank tried PreMulSum(0.5) on fp8, which the library refuses
    on purpose (48 failed calls): the matrix now asks the transport of the communicator."""
    from tests.gpu import matrix

    transport, _, _, _ = make(size=size, version=FP8_VERSION)
    comm = Communicator(transport, SoloControl(), timeout=5.0) if size == 1 else None
    comm = comm or SimpleNamespace(backend="nccl", transport=transport)
    for dtype in matrix.FP8_DTYPES:
        ops = matrix.ops_for(dtype, comm)
        assert ("premul" in ops) == (size == 2) and {"sum", "avg", "max"} <= set(ops), ops
    assert matrix.ops_for("float32", comm) == matrix.candidate_ops("float32", "nccl")
    assert matrix.ops_for("int16", comm) == [] and "prod" not in matrix.ops_for("complex64", comm)
    old, _, _, _ = make(size=1, version=FP8_VERSION, capability="80")  # fp8 reductions need sm90
    assert matrix.ops_for("float8_e4m3fn", SimpleNamespace(backend="nccl", transport=old)) == []
    transport.close()
    old.close()


@pytest.mark.parametrize(
    ("version", "capability", "skip"),
    [(FP8_VERSION, "90", None), ("2.23.4", "90", "NCCL 2.23.4 has no fp8 types"), (FP8_VERSION, "80", "sm90")],
)
def test_the_gpu_fp8_test_skips_where_the_library_refuses_fp8(version, capability, skip):
    """test_one_rank_fp8_avg_and_premul skipped on a GPU below sm90 only; on NCCL < 2.24 (which a
    torch CUDA 12 build can pin) the library refuses fp8 reductions too, so it must skip there."""
    from denseccl.backends.nccl.tables import version_code
    from tests.gpu.support import fp8_reduction_problem

    code = version if isinstance(version, int) else version_code(*map(int, version.split(".")))
    transport, _, _, _ = make(size=1, version=code, capability=capability)
    problem = fp8_reduction_problem(transport)
    if skip is None:
        assert problem is None
        transport.check_op(ReduceOp.AVG, E4M3)
    else:
        assert skip in problem
        with pytest.raises(ArgumentError):  # what the GPU test would have hit instead of skipping
            check_op_for_dtype(ReduceOp.AVG, E4M3, transport.dtypes, "nccl")
            transport.check_op(ReduceOp.AVG, E4M3)
    transport.close()


def test_two_ranks_fp8_avg_stays_avg():
    transport, comm, _, _ = make(size=2, version=FP8_VERSION)
    transport.allreduce(100, 100, 8, E4M3, ReduceOp.AVG, S)
    transport.allreduce(100, 100, 8, E4M3, PreMulSum(0.5), S)
    assert [call[5] for call in comm.calls] == [4, 5]


# -- 1b. an argument error before the enqueue ------------------------------------------------------


def test_invalid_argument_leaves_the_communicator_usable(solo):
    x = HostCAI(np.ones(4, np.float32))
    solo.fake.fail_next = NcclError(4)
    with pytest.raises(ArgumentError, match="NCCL refused the arguments of allreduce.*stays usable"):
        solo.allreduce(x)
    assert solo.broken is None and wait_for(lambda: solo.transport._watchdog.in_flight == 0)
    assert solo.allreduce(x) is x and solo.fake.calls[-1][0] == "allReduce"


def test_other_nccl_errors_still_break_it(solo):
    solo.fake.fail_next = NcclError(2)  # ncclSystemError
    with pytest.raises(NcclError):
        solo.allreduce(HostCAI(np.ones(4, np.float32)))
    with pytest.raises(CommunicatorBrokenError):
        solo.allreduce(HostCAI(np.ones(4, np.float32)))


# -- 2. CUDA graph capture -----------------------------------------------------------------------


def test_captured_call_has_no_watchdog_entry_and_no_event_query():
    transport, comm, cuda, _ = make(timeout=0.2, current=77)
    cuda.auto_done = False
    cuda.capturing.add(77)
    pending = transport.allreduce(1, 1, 4, F32, ReduceOp.SUM, S)
    assert comm.calls[-1][-1] == 77 and pending.captured
    assert transport._watchdog.in_flight == 0
    time.sleep(0.4)  # past the timeout: nothing watched, nothing aborted
    assert transport.failure() is None and not comm.aborted
    assert pending.test() and cuda.queries == 0
    pending.wait(None)  # ran on the current stream: nothing to do
    cuda.current_pointer = 5  # another stream of the same capture joins it
    pending.wait(None)
    assert cuda.waits == [(5, cuda.recorded[-1])]
    pending.synchronize(time.monotonic() + 1)  # never blocks the host for a captured call
    cuda.capturing.clear()  # the capture ended: replays order themselves
    pending.wait(None)
    assert len(cuda.waits) == 2 and cuda.queries == 0
    eager = transport.allreduce(1, 1, 4, F32, ReduceOp.SUM, S)  # after the capture: watched again
    assert not eager.captured and transport._watchdog.in_flight == 1
    assert wait_for(lambda: transport.failure() is not None)  # and its timeout counts
    assert not comm.aborted and comm.persistent_refs == 1  # the graph may still hold it: kept, not aborted
    transport.close()


def test_no_event_query_while_a_capture_runs():
    """CUDA's global capture mode: an event query from any thread invalidates a capture in
    progress (the fake does that too). Once a call has seen a capture on the device, the
    watchdogs of every communicator there stop querying until it ends, then resume."""
    transport, comm, cuda, _ = make(timeout=None, interval=0.01)
    other = nccl.NCCLTransport(  # a second communicator on the same device and CUDA
        FakeComm(0, 2), 0, version=FP8_VERSION, events=cuda.streams(), library=FakeLibrary(), watchdog_interval=0.01
    )
    cuda.auto_done = False
    eager = [transport.allreduce(1, 1, 4, F32, ReduceOp.SUM, S), other.allreduce(1, 1, 4, F32, ReduceOp.SUM, S)]
    assert wait_for(lambda: cuda.queries > 4)  # both watchdogs poll the eager calls
    assert transport.wait_idle(0.05) is False  # still in flight: not the moment to begin a capture
    cuda.capture_mode = "relaxed"  # until the call below has seen the capture (then it is global)
    cuda.capturing.add(88)
    captured = transport.allreduce(1, 1, 4, F32, ReduceOp.SUM, StreamRef(88, "cupy", 0))
    assert captured.captured
    assert _queries_stop(cuda)  # a poll that had begun before the call has ended
    cuda.capture_mode = "global"
    time.sleep(0.3)
    assert cuda.invalidated == set()
    cuda.capturing.clear()  # end_capture
    for pending in eager:
        pending._event.finished = True
    assert transport.wait_idle(5) and other.wait_idle(5)
    assert cuda.invalidated == set() and transport.failure() is None and other.failure() is None
    transport.close()
    other.close()


def _queries_stop(cuda, within=5.0):
    """Whether the event queries stop (none during 0.1 s) within ``within`` seconds."""
    end = time.monotonic() + within
    while time.monotonic() < end:
        before = cuda.queries
        time.sleep(0.1)
        if cuda.queries == before:
            return True
    return False


@pytest.mark.parametrize("settle", [True, False])
def test_the_gpu_capture_sequence_on_the_fakes(settle):
    """tests/gpu/test_gpu_single.py::test_cupy_graph_capture_and_replay on the fakes: an eager
    warm-up completes (stream.synchronize), then a capture begins. The watchdog retires the
    warm-up only on its next poll, so the test must wait for that (settle) before capturing:
    without the wait that poll queries an event during the capture and invalidates it."""
    transport, comm, cuda, _ = make(timeout=None, interval=0.01)
    cuda.auto_done = False
    transport.allreduce(1, 1, 4, F32, PreMulSum(2.0), S)  # the warm-up
    cuda.recorded[-1].finished = True  # stream.synchronize() returned
    if settle:
        assert transport.wait_idle(5)
    cuda.capturing.add(77)  # stream.begin_capture(); other work is captured before the first denseccl call
    if settle:
        time.sleep(0.1)
        transport.allreduce(1, 1, 4, F32, PreMulSum(2.0), S)
        transport.allreduce(1, 1, 4, F32, ReduceOp.SUM, S).wait(None)
        assert cuda.invalidated == set() and transport._watchdog.in_flight == 0
    else:  # the watchdog's poll breaks the capture; the call says so, and nothing else breaks
        assert wait_for(lambda: cuda.invalidated == {77})
        with pytest.raises(ArgumentError, match="invalidated"):
            transport.allreduce(1, 1, 4, F32, PreMulSum(2.0), S)
        assert cuda.invalidated == {77}
    cuda.capturing.clear()  # stream.end_capture()
    assert transport.wait_idle(5) and transport.failure() is None
    transport.close()


def test_premul_ops_of_a_capture_live_as_long_as_the_communicator():
    transport, comm, cuda, library = make()
    cuda.capturing.add(77)
    transport.allreduce(1, 1, 4, F32, PreMulSum(0.25), S)
    captured_op = comm.calls[-1][5]
    cuda.capturing.clear()
    for i in range(80):
        transport.allreduce(1, 1, 4, F32, PreMulSum(1.0 + i), S)
    assert captured_op not in [op for op, _ in library.destroyed] and len(library.destroyed) == 17
    transport.allreduce(1, 1, 4, F32, PreMulSum(0.25), S)
    assert comm.calls[-1][5] == captured_op  # still cached: a replay would use it
    transport.close()  # retired: the graph may outlive the close, and its replays use the op
    assert captured_op not in [op for op, _ in library.destroyed] and not comm.destroyed


def test_barrier_during_capture_is_refused_and_harmless():
    transport, comm, cuda, _ = make(current=8)
    cuda.capturing.add(8)
    with pytest.raises(DenseCCLError, match="captured into a CUDA graph"):
        transport.barrier()
    assert comm.calls == [] and transport.failure() is None and transport._inside == 0
    cuda.capturing.clear()
    transport.barrier().wait(time.monotonic() + 1)


def test_an_invalidated_capture_is_a_clear_error_not_a_broken_communicator(solo):
    """CuPy's Stream.is_capturing raises for an invalidated capture and, on the legacy stream,
    while another stream captures: refused before the call, with what to do; still usable."""
    x = HostCAI(np.ones(4, np.float32))
    solo.cuda.capturing.add(55)
    solo.cuda.invalidated.add(55)
    with pytest.raises(ArgumentError, match="capture of stream 0x37 into a CUDA graph was invalidated.*end_capture"):
        solo.allreduce(x)
    solo.cuda.invalidated.clear()
    solo.cuda.capturing = {77}
    legacy = "legacy default stream.*cudaErrorStreamCaptureImplicit.*non-default stream"
    with pytest.raises(ArgumentError, match=legacy):
        solo.allreduce(x, stream=0)
    assert solo.broken is None and solo.fake.calls == [] and solo.transport._inside == 0
    solo.cuda.capturing.clear()
    assert solo.allreduce(x) is x and solo.fake.calls[-1][0] == "allReduce"


def test_other_cuda_errors_of_is_capturing_are_not_renamed():
    transport, _, cuda, _ = make()
    cuda.module.cuda.runtime.streamIsCapturing = lambda stream: (_ for _ in ()).throw(RuntimeError("cudaErrorX"))
    with pytest.raises(RuntimeError, match="cudaErrorX"):
        transport.allreduce(1, 1, 4, F32, ReduceOp.SUM, S)
    transport.close()


def test_communicator_under_capture(solo):
    solo.cuda.capturing.add(55)
    solo.cuda.auto_done = False
    x = HostCAI(np.ones((3, 4), np.float32).T)
    assert solo.allreduce(x, "avg") is x
    work = solo.allgather(x, out=HostCAI(np.zeros((1, 3, 4), np.float32).transpose(0, 2, 1)), async_op=True)
    assert work.is_completed() and work.wait() is not None and work.synchronize() is not None
    assert solo.cuda.queries == 0 and solo.transport._watchdog.in_flight == 0
    assert [call[0] for call in solo.fake.calls] == ["allReduce", "allGather"]


# -- 3. abort and destroy never under a call inside NCCL --------------------------------------------


def _call_in_thread(transport, comm):
    comm.gate = threading.Event()
    gate = comm.gate
    errors = []

    def body():
        try:
            transport.allreduce(1, 1, 4, F32, ReduceOp.SUM, S)
        except Exception as error:  # noqa: BLE001
            errors.append(error)

    thread = threading.Thread(target=body)
    thread.start()
    assert comm.entered.wait(5)
    return thread, gate, errors


def test_abort_waits_for_a_call_inside_nccl(caplog):
    transport, comm, _, _ = make(grace=30)
    thread, gate, errors = _call_in_thread(transport, comm)
    aborting = threading.Thread(target=transport.abort, args=("peer gone", True))
    with caplog.at_level("WARNING", logger="denseccl"):
        aborting.start()
        assert wait_for(lambda: transport.failure() is not None)
        with pytest.raises(CollectiveTimeoutError, match="peer gone"):
            transport.allreduce(1, 1, 4, F32, ReduceOp.SUM, S)  # refused at once, never enters NCCL
        started = time.monotonic()
        assert transport.async_error() is None and time.monotonic() - started < 5
        assert wait_for(lambda: "ncclCommAbort waits (at most 30 s) until the NCCL call" in caplog.text)
        assert not comm.aborted  # waiting: the call is still inside
        gate.set()
        thread.join(5)
        aborting.join(5)
    assert "peer gone; ncclCommAbort waits" in caplog.text
    assert comm.aborted and not comm.freed_while_inside and errors == [] and not aborting.is_alive()


def test_abort_releases_a_call_that_only_the_abort_can_release(caplog):
    """NCCL connects peers during the first collective: a call stuck connecting to a dead peer
    returns only once ncclCommAbort sets the abort flag. Waiting for it before aborting would
    hang forever; past the grace the watchdog aborts under it, and the call says why."""
    transport, comm, cuda, _ = make(timeout=0.2, grace=0.3)
    cuda.auto_done = False
    comm.released_by_abort = True
    with caplog.at_level("WARNING", logger="denseccl"):
        thread, _, errors = _call_in_thread(transport, comm)
        assert wait_for(lambda: comm.aborted, 5)
        thread.join(5)
    assert not thread.is_alive() and len(errors) == 1
    assert isinstance(errors[0], CollectiveTimeoutError) and "did not complete within 0.2 s" in str(errors[0])
    assert "did not return within 0.3 s" in caplog.text and comm.freed_while_inside
    with pytest.raises(CollectiveTimeoutError):
        transport.allreduce(1, 1, 4, F32, ReduceOp.SUM, S)
    transport.close()


def test_watchdog_timeout_during_a_blocked_enqueue_is_an_error_not_a_free():
    transport, comm, cuda, _ = make(timeout=0.2)
    cuda.auto_done = False
    thread, gate, _ = _call_in_thread(transport, comm)
    assert wait_for(lambda: transport.failure() is not None)
    assert "did not complete within 0.2 s" in transport.failure() and not comm.aborted
    gate.set()
    thread.join(5)
    assert comm.aborted and not comm.freed_while_inside


def test_async_error_is_polled_while_a_call_is_inside():
    transport, comm, _, _ = make()
    thread, gate, _ = _call_in_thread(transport, comm)
    comm.async_error = "NCCL_ERROR_REMOTE_ERROR"
    started = time.monotonic()
    # a poll that waited for the call would return only with the fake's gate (10 s)
    assert "REMOTE_ERROR" in transport.async_error() and time.monotonic() - started < 5
    gate.set()
    thread.join(5)
    transport.close()


def test_close_waits_for_a_call_inside_nccl():
    """close() refuses new calls at once, lets the call inside NCCL return and its work
    complete, then destroys the communicator."""
    transport, comm, _, _ = make(grace=10)
    thread, gate, _ = _call_in_thread(transport, comm)
    closing = threading.Thread(target=transport.close)
    closing.start()
    assert wait_for(lambda: transport._closed)
    with pytest.raises(DenseCCLError, match="closed"):
        transport.allreduce(1, 1, 4, F32, ReduceOp.SUM, S)
    time.sleep(0.1)
    assert not comm.destroyed and closing.is_alive()
    gate.set()
    thread.join(5)
    closing.join(5)
    assert comm.destroyed and not comm.freed_while_inside and not closing.is_alive()


def test_many_threads_and_an_abort():
    """Calls from several threads and a concurrent abort: the communicator is freed once, by
    whoever leaves last, and never while a call is inside."""
    transport, comm, _, _ = make()
    stop = threading.Event()

    def hammer():
        while not stop.is_set():
            try:
                transport.allreduce(1, 1, 4, F32, ReduceOp.SUM, S)
            except CommunicatorBrokenError:
                return

    threads = [threading.Thread(target=hammer) for _ in range(4)]
    for thread in threads:
        thread.start()
    time.sleep(0.05)
    transport.abort("stop", timed_out=False)
    stop.set()
    for thread in threads:
        thread.join(5)
    assert wait_for(lambda: comm.aborted) and not comm.freed_while_inside and transport._inside == 0


@pytest.mark.parametrize("order", ["after_abort", "together"])
def test_the_gpu_hang1_scenario_on_the_fakes(order, monkeypatch):
    """tests/gpu/rank.py hang1 on the fakes, where ncclCommAbort waits for the whole device (it
    frees device memory) as on a GPU: blocking both streams at the start (the old order) lets
    the first abort release the second call, so its watchdog has nothing to catch."""
    from tests.gpu import rank

    monkeypatch.setattr(arrays, "_cuda_device_of_pointer", lambda pointer: 0)
    monkeypatch.setattr(streams, "current_stream_pointer", lambda library, device: 55)
    monkeypatch.setattr(rank, "FAILURES", [])
    cuda = FakeCuda(55)

    fakes = []

    def communicator(timeout):
        comm = FakeComm(0, 1)
        fakes.append(comm)
        comm.abort_waits = cuda.wait_device
        transport = nccl.NCCLTransport(
            comm, 0, timeout=timeout, version=FP8_VERSION, events=cuda.streams(), library=FakeLibrary(),
            watchdog_interval=0.01,
        )
        return Communicator(transport, SoloControl(), timeout=30)

    first, second = communicator(2), communicator(1.5)
    xs = [HostCAI(np.ones(4, np.float32)), HostCAI(np.ones(4, np.float32))]
    blocks = [SimpleStream(66), SimpleStream(67)]
    rank.hang_scenario(
        first, second, xs, blocks, lambda index, seconds: cuda.block(blocks[index].ptr, seconds), gate=1.5,
        order=order, verdict_within=10, host_bound=5,
    )
    # PreMulSums, for which NCCL launches a kernel even with one rank (an in-place sum: nothing)
    assert [call[5] >= 5 for fake in fakes for call in fake.calls] == [True, True]
    if order == "after_abort":
        assert rank.FAILURES == [] and "did not complete within 1.5 s" in second.broken
    else:
        assert [failure for failure in rank.FAILURES if "watchdog verdict None" in failure], rank.FAILURES


# -- 4. torch tensors used on a stream other than torch's current one -------------------------------


class _FakeTensor:
    """Stands for a CUDA torch tensor around a host array (what the Communicator asks of it)."""

    def __init__(self, array):
        self.array = array
        self.recorded = []

    def is_conj(self):
        return False

    def is_neg(self):
        return False

    def record_stream(self, stream):
        self.recorded.append(stream.cuda_stream)


@pytest.fixture()
def torch_like(solo, monkeypatch):
    """The solo Communicator, with _FakeTensor inputs seen as CUDA torch tensors and a fake torch
    whose current stream on the device is 55."""
    import sys
    from types import SimpleNamespace

    import denseccl.communicator as communicator_module

    real_as_buffer = communicator_module.as_buffer

    def as_buffer(x):
        if isinstance(x, _FakeTensor):
            return real_as_buffer(HostCAI(x.array))._replace(library="torch", owner=x)
        return real_as_buffer(x)

    cuda = SimpleNamespace(ExternalStream=_external_stream, default_stream=lambda device: _torch_stream(0, device))
    monkeypatch.setattr(communicator_module, "as_buffer", as_buffer)
    monkeypatch.setitem(sys.modules, "torch", SimpleNamespace(cuda=cuda, Tensor=type(None)))
    streams._torch_stream.cache_clear()  # the fake streams made here must not outlive the test
    yield solo
    streams._torch_stream.cache_clear()


_POOL = iter(range(0x5000, 0x6000))


def _torch_stream(pointer, device):
    return SimpleNamespace(cuda_stream=pointer, device=device)


def _external_stream(stream_ptr, device=None):
    """torch.cuda.ExternalStream: torch's Stream(stream_ptr=...), which takes a null pointer as
    "none given" and hands out a stream from its pool (THCPStream_pynew)."""
    return _torch_stream(stream_ptr or next(_POOL), device)


def test_torch_tensors_on_the_default_stream_are_recorded_on_it(torch_like):
    """Handle 0 is torch's default stream: recording there must name that stream, not a pool
    stream (which would delay the reuse of the tensor's memory for nothing)."""
    x = _FakeTensor(np.ones(6, np.float32))
    torch_like.allreduce(x, stream=0)
    torch_like.broadcast(x, 0, stream=0)
    assert x.recorded == [0, 0]


def test_torch_tensors_on_another_stream_are_recorded_there(torch_like):
    x, out = _FakeTensor(np.ones(6, np.float32)), _FakeTensor(np.zeros(6, np.float32))
    torch_like.allreduce(x, out=out, stream=SimpleStream(66))
    assert x.recorded == [66] and out.recorded == [66]  # both, on the stream NCCL used
    torch_like.allreduce(x)  # torch's current stream (torch ignores it where it allocated x)
    work = torch_like.broadcast(x, 0, async_op=True, stream=SimpleStream(67))
    assert x.recorded == [66, 55, 67]
    work.wait()
    stacked = _FakeTensor(np.zeros((1, 6), np.float32))
    torch_like.allgather(x, out=stacked, stream=SimpleStream(68))
    torch_like.reduce_scatter(stacked, out=out, stream=SimpleStream(69))
    torch_like.reduce(x, 0, stream=SimpleStream(70))
    assert x.recorded == [66, 55, 67, 68, 70] and stacked.recorded == [68, 69] and out.recorded == [66, 69]


def test_other_arrays_are_not_recorded(solo):
    x = HostCAI(np.ones(6, np.float32))
    solo.allreduce(x, stream=SimpleStream(66))  # no record_stream for a non-torch array: nothing to call
    streams.record_stream(None, ())
    streams.record_stream(StreamRef(66, "cupy", 0), arrays.as_buffer(x))
    assert solo.fake.calls[-1][-1] == 66


class SimpleStream:
    def __init__(self, pointer):
        self.ptr = pointer
