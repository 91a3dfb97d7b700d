"""The NCCL path under a store launch agrees on the shared-memory board (denseccl/board/), on the
CPU with CuPy and NCCL replaced by fakes (tests/unit/test_nccl_bootstrap_flow.py): ranks as
threads of one process share its host. After the communicator is made, a call makes no store
operation (counted through a wrapping store); a mismatch still raises on every rank."""

from __future__ import annotations

import time
from datetime import timedelta

import numpy as np
import pytest

import denseccl
from denseccl.board import segment
from denseccl.board.control import SharedControl
from denseccl.backends.store import StoreControl
from denseccl.errors import MismatchError
from tests.unit.test_nccl_bootstrap_flow import _in_threads, fakes, waiting_policy  # noqa: F401 - fixtures
from tests.unit.test_nccl_transport import HostCAI

pytestmark = pytest.mark.skipif(not segment.available(), reason="no /dev/shm here")


@pytest.mark.parametrize("size", [2, 4])
def test_store_launch_agrees_on_the_board_without_store_operations(fakes, size):  # noqa: F811 - the fixture
    torch_distributed = pytest.importorskip("torch.distributed")
    from tests.support.counting_store import CountingStore

    server = torch_distributed.TCPStore("127.0.0.1", 0, size + 1, True, timeout=timedelta(seconds=30),
                                        wait_for_workers=False)

    def body(rank):
        store = CountingStore(torch_distributed.TCPStore("127.0.0.1", server.port, size + 1, False,
                                                         timeout=timedelta(seconds=30)))
        comm = denseccl.init(backend="nccl", store=store, rank=rank, size=size, device=0, timeout=20)
        control = comm.control
        assert isinstance(control, SharedControl) and control.board is not None, control
        assert isinstance(control.inner, StoreControl)  # mismatch reports and splits only
        ok = HostCAI(np.zeros((2, 3), np.float32))
        comm.allreduce(ok)
        before = store.ops
        started = time.perf_counter()
        for _ in range(50):
            assert comm.allreduce(ok) is ok
        seconds = (time.perf_counter() - started) / 50
        calls = store.ops - before
        odd = HostCAI(np.zeros((2, 3), np.float32) if rank else np.zeros((3, 2), np.float32).T)
        try:
            comm.allreduce(odd)
            outcome = "no error"
        except MismatchError as error:
            outcome = str(error)
        return calls, seconds, outcome

    for calls, _, outcome in _in_threads(size, body):
        assert calls == 0, f"{calls} store operations in 50 calls"
        assert "mismatch" in outcome and "layout" in outcome, outcome
