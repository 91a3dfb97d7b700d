"""An interrupt (KeyboardInterrupt) in each wait of the NCCL path, on the CPU with CuPy and NCCL
replaced by fakes (tests/unit/test_nccl_bootstrap_flow.py), ranks as threads under a store
launch (the agreement on the host's board): in the agreement step, and in a host's wait on the
call (``Work.synchronize``). A signal reaches only a process's main thread, so the interrupt is
raised in the rank's thread (``PyThreadState_SetAsyncExc``) once that thread is inside the wait.

No rank ever returns from the interrupted call's generation: the interrupted rank's
communicator is broken, and every peer raises ``CommunicatorBrokenError`` naming rank 0 — a
peer whose NCCL work pairs with the abandoned call too, at once (the transport hears the give-up
and aborts its NCCL communicator) rather than at the timeout."""

from __future__ import annotations

import ctypes
import sys
import threading
import time
from datetime import timedelta
from typing import Any, Dict, List

import numpy as np
import pytest

import denseccl
from denseccl.backends.nccl import transport as nccl_transport
from denseccl.channel import segment
from denseccl.errors import CollectiveTimeoutError, CommunicatorBrokenError
from tests.unit.test_nccl_bootstrap_flow import fakes, waiting_policy  # noqa: F401 - fixtures
from tests.unit.test_nccl_fakes import FakeCuda
from tests.unit.test_nccl_transport import HostCAI

pytestmark = pytest.mark.skipif(not segment.available(), reason="no memfd_create or socket.send_fds here")

#: the wait -> the functions on the interrupted thread's stack once it is inside that wait
WAITS = {"agreement": ("all_equal", "wait_until"), "transfer": ("synchronize", "wait_until")}


def inside(thread: threading.Thread, names: tuple) -> bool:
    frame = sys._current_frames().get(thread.ident)  # type: ignore[arg-type]
    found = set()
    while frame is not None:
        found.add(frame.f_code.co_name)
        frame = frame.f_back
    return all(name in found for name in names)


def interrupt(thread: threading.Thread, names: tuple) -> None:
    """Raise KeyboardInterrupt in ``thread`` once it is inside the functions ``names``."""
    deadline = time.monotonic() + 20
    while not inside(thread, names):
        assert time.monotonic() < deadline, f"{thread.name} never reached {names}"
        time.sleep(0.002)
    done = ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(KeyboardInterrupt))
    assert done == 1


@pytest.mark.timeout(120)
@pytest.mark.parametrize("size", [2, 3])
@pytest.mark.parametrize("wait", sorted(WAITS))
def test_an_interrupt_breaks_the_nccl_path_on_every_rank(fakes, wait, size, monkeypatch):  # noqa: F811
    torch_distributed = pytest.importorskip("torch.distributed")
    cudas: Dict[str, FakeCuda] = {}

    def streams(device: int) -> Any:
        cuda = cudas[threading.current_thread().name] = FakeCuda()
        return cuda.streams(device)

    monkeypatch.setattr(nccl_transport, "CudaStreams", streams)
    server = torch_distributed.TCPStore("127.0.0.1", 0, size + 1, True, timeout=timedelta(seconds=30),
                                        wait_for_workers=False)
    ready = threading.Barrier(size + 1)
    interrupted = threading.Event()
    outcomes: List[List[str]] = [[] for _ in range(size)]

    def outcome(call: Any) -> str:
        try:
            call()
        except KeyboardInterrupt:
            return "interrupted"
        except CollectiveTimeoutError as error:
            return f"timed out: {error}"
        except CommunicatorBrokenError as error:
            return f"broken: {error}"
        return "returned"

    def body(rank: int) -> None:
        store = torch_distributed.TCPStore("127.0.0.1", server.port, size + 1, False, timeout=timedelta(seconds=30))
        comm = denseccl.init(backend="nccl", store=store, rank=rank, size=size, device=0, timeout=20)
        x = HostCAI(np.full((2, 3), rank, np.float32))
        comm.allreduce(x)
        gate = cudas[threading.current_thread().name].block(0, 60)  # the NCCL work does not complete
        ready.wait(30)
        try:
            if wait == "agreement":
                if rank:
                    interrupted.wait(30)  # rank 0 waits alone in the agreement step, posted
                outcomes[rank].append(outcome(lambda: comm.allreduce(x)))
            else:
                # a peer still in the agreement step when rank 0 gives up raises there
                outcomes[rank].append(outcome(lambda: comm.allreduce(x, async_op=True).synchronize()))
            interrupted.wait(30)
            outcomes[rank].append(outcome(lambda: comm.allreduce(x)))
        finally:
            gate.set()
        comm.close()

    threads = [threading.Thread(target=body, args=(rank,), name=f"rank{rank}") for rank in range(size)]
    for thread in threads:
        thread.start()
    ready.wait(30)
    interrupt(threads[0], WAITS[wait])
    while not outcomes[0]:
        time.sleep(0.002)
    interrupted.set()
    for thread in threads:
        thread.join(60)
    assert outcomes[0] == ["interrupted", outcomes[0][1]] and outcomes[0][1].startswith("broken"), outcomes[0]
    assert "interrupted while waiting (KeyboardInterrupt)" in outcomes[0][1]
    for rank in range(1, size):
        assert len(outcomes[rank]) == 2 and all(o.startswith("broken") for o in outcomes[rank]), outcomes[rank]
        assert "rank 0 gave up" in outcomes[rank][0], outcomes[rank]
