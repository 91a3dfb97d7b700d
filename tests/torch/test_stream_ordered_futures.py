"""CUDA futures are stream-ordered (issue 35, item 6), on the CPU with the NCCL fakes
(tests/unit/test_nccl_fakes.py): the torch adapter's asynchronous NCCL operation completes its
future at once, its steps having made the caller's current stream wait for the collective, so
DDP's ``finalize_backward`` (a ``wait()`` on each bucket's future) returns while the GPU still
runs the allreduce. Operations the host must see finish (a barrier's, or one whose peers must
learn its failure) still go to the progress thread."""

from __future__ import annotations

import contextlib
import time
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from denseccl import arrays, streams  # noqa: E402
from denseccl.backends.store import SoloControl  # noqa: E402
from denseccl.communicator import Communicator  # noqa: E402
from denseccl.torch import process_group  # noqa: E402
from denseccl.torch.process_group import ProcessGroupDenseCCL  # noqa: E402
from denseccl.torch.progress import AsyncWork, Operation, Progress, stream_ordered  # noqa: E402
from tests.unit.test_nccl_fakes import S, make  # noqa: E402
from tests.unit.test_nccl_transport import HostCAI  # noqa: E402

pytestmark = pytest.mark.torch

CURRENT = 55  # the caller's current stream; the collective runs on S (77), as ProcessGroupNCCL's does
CUDA = torch.device("cuda", 0)


@pytest.fixture()
def device(monkeypatch):
    """A one-rank Communicator on the fake NCCL transport, and a process group's ``_run`` that
    uses it with a host future (CPU torch has no CUDA futures) and no device switch."""
    monkeypatch.setattr(arrays, "_cuda_device_of_pointer", lambda pointer: 0)
    monkeypatch.setattr(streams, "current_stream_pointer", lambda library, device: CURRENT)
    monkeypatch.setattr(process_group, "new_future", lambda device: torch.futures.Future())
    monkeypatch.setattr(process_group, "cuda_context", lambda device: contextlib.nullcontext())
    transport, fake, cuda, _ = make(size=1, current=CURRENT, timeout=30.0)
    communicator = Communicator(transport, SoloControl(), timeout=30.0)
    group = SimpleNamespace(_progress=Progress("stream-ordered-test"), _seconds=30.0)
    yield communicator, cuda, group
    for gate, _ in cuda.blocked.values():
        gate.set()
    group._progress.stop(grace=1.0)
    communicator.close()


def _allreduce(group, communicator, x, **kwargs):
    """What the adapter's all_reduce does for a CUDA tensor with async_op=True (DDP's reducer)."""

    def issue():
        work = communicator.allreduce(x, async_op=True, stream=S.pointer)
        return [work], lambda: [x]

    return ProcessGroupDenseCCL._run(group, "allreduce", SimpleNamespace(asyncOp=True), CUDA, issue, **kwargs)


def test_the_future_completes_before_the_stream_runs_the_collective(device):
    communicator, cuda, group = device
    gate = cuda.block(S.pointer, 30.0)  # the GPU has not reached the allreduce
    x = HostCAI(np.ones(8, np.float32))
    started = time.monotonic()
    work = _allreduce(group, communicator, x)
    future = work.get_future()
    assert future.done()  # before the fix: not done until a host thread saw the event (30 s here)
    seen = []
    chained = future.then(lambda f: seen.append(f.value()) or "next")  # DDP's comm hook chains like this
    assert work.wait() is True and chained.wait() == "next" and seen == [[x]]
    took = time.monotonic() - started
    assert took < 5.0, took
    event = cuda.recorded[-1]
    assert event.stream == S.pointer and not event.done  # the collective is still queued on S
    assert (CURRENT, event) in [(stream, e) for stream, e in cuda.waits]  # the current stream waits for it
    assert group._progress._thread is None  # no host thread watches it
    gate.set()
    assert event.done


def test_an_operation_whose_peers_must_learn_its_failure_goes_to_the_thread(device):
    communicator, cuda, group = device
    gate = cuda.block(S.pointer, 30.0)
    x = HostCAI(np.ones(8, np.float32))
    work = _allreduce(group, communicator, x, on_failure=lambda error: None)
    assert not work.get_future().done() and not work.is_completed()
    gate.set()
    work.wait(10)
    assert work.get_future().done() and work.get_future().value() == [x]


def test_only_steps_that_order_streams_complete_at_once():
    class Step:
        def __init__(self, ordered):
            if ordered is not None:
                self.stream_ordered = ordered
            self.waits = 0

        def is_completed(self):
            return True

        def wait(self, timeout=None):
            self.waits += 1

    def operation(*steps, on_failure=None):
        return Operation("x", list(steps), lambda: [], torch.futures.Future(), None, on_failure=on_failure)

    assert stream_ordered(operation(Step(True), Step(True)))
    assert not stream_ordered(operation(Step(True), Step(False)))  # a barrier's: wait() blocks the host
    assert not stream_ordered(operation(Step(None)))  # MPI requests, all-to-all steps
    assert not stream_ordered(operation(Step(True), on_failure=print))
    progress = Progress("cpu-test")
    host = operation(Step(True))
    progress.launch(host, torch.device("cpu"))  # a CPU operation: the thread completes it
    AsyncWork(progress, host).wait()
    assert host.done and progress._thread is not None and host.steps[0].waits == 1
    progress.stop(grace=1.0)


def test_a_barrier_step_is_not_stream_ordered(device):
    communicator, cuda, group = device
    x = HostCAI(np.ones(8, np.float32))
    assert communicator.allreduce(x, async_op=True, stream=S.pointer).stream_ordered
    from denseccl.backends.nccl.pending import NCCLPending

    assert not NCCLPending(communicator.transport, None, S, host=True).stream_ordered
