"""The NCCL path under a store launch agrees on the shared-memory board (denseccl/channel/), on the
CPU with CuPy and NCCL replaced by fakes (tests/unit/test_nccl_bootstrap_flow.py): ranks as
threads of one process share its host. After the communicator is made, a call makes no store
operation (counted through a wrapping store); a mismatch still raises on every rank."""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pytest

import denseccl
from denseccl.channel import segment
from denseccl.channel.shared import SharedControl
from denseccl.backends.store import StoreControl
from denseccl.errors import MismatchError
from tests.unit.test_nccl_bootstrap_flow import _in_threads, fakes, waiting_policy  # noqa: F401 - fixtures
from tests.unit.test_nccl_transport import HostCAI

pytestmark = pytest.mark.skipif(not segment.available(), reason="no memfd_create or socket.send_fds here")


@pytest.mark.parametrize("size", [2, 4])
@pytest.mark.parametrize("board", [True, False], ids=["board", "store"])
def test_store_launch_agrees_on_the_board_without_store_operations(fakes, size, board, monkeypatch):  # noqa: F811
    """With boards off (``DENSECCL_SHARED_AGREEMENT=0``) the store channel makes its four
    operations per call (set, wait, multi_get, delete): what the board removes. ``pytest -s``
    prints both (docs/benchmark.md; no time: threads of one process take turns on the GIL)."""
    torch_distributed = pytest.importorskip("torch.distributed")
    if not board:
        monkeypatch.setenv("DENSECCL_SHARED_AGREEMENT", "0")
    from tests.support.counting_store import CountingStore

    server = torch_distributed.TCPStore("127.0.0.1", 0, size + 1, True, timeout=timedelta(seconds=30),
                                        wait_for_workers=False)

    def body(rank):
        store = CountingStore(torch_distributed.TCPStore("127.0.0.1", server.port, size + 1, False,
                                                         timeout=timedelta(seconds=30)))
        comm = denseccl.init(backend="nccl", store=store, rank=rank, size=size, device=0, timeout=20)
        control = comm.control
        if board:
            assert isinstance(control, SharedControl) and control.board is not None, control
            assert isinstance(control.inner, StoreControl)  # mismatch reports and splits only
        else:
            assert isinstance(control, StoreControl), control
        ok = HostCAI(np.zeros((2, 3), np.float32))
        comm.allreduce(ok)
        before = store.ops
        for _ in range(50):
            assert comm.allreduce(ok) is ok
        calls = store.ops - before
        odd = HostCAI(np.zeros((2, 3), np.float32) if rank else np.zeros((3, 2), np.float32).T)
        try:
            comm.allreduce(odd)
            outcome = "no error"
        except MismatchError as error:
            outcome = str(error)
        return calls, control.path(), outcome

    results = _in_threads(size, body)
    for calls, _, outcome in results:
        assert calls == (0 if board else 4 * 50), f"{calls} store operations in 50 calls"
        assert "mismatch" in outcome and "layout" in outcome, outcome
    print(f"\nNCCL path (fakes), store launch, {size} ranks as threads: {results[0][1]}, "
          f"{results[0][0] / 50:g} store operations per call")
