"""The host transports' bytes between ranks (``Transport.alltoallv``, ``send``, ``recv``), which
the torch adapter's all-to-all and point-to-point take: on one MPI rank, to itself; a transport
without them says so."""

from __future__ import annotations

import numpy as np
import pytest

import denseccl
from denseccl.errors import DenseCCLError
from denseccl.transport import Transport


def test_a_rank_sends_to_itself_and_learns_the_source() -> None:
    with denseccl.init(backend="mpi", timeout=30) as comm:
        transport = comm.transport
        sent, got = np.arange(5, dtype=np.int32), np.zeros(5, dtype=np.int32)
        receive = transport.recv(got.ctypes.data, got.nbytes, -1, 7)
        send = transport.send(sent.ctypes.data, sent.nbytes, 0, 7)
        for pending in (send, receive):
            pending.wait(None)
        assert receive.test() and receive.source() == 0  # a test after completion keeps the source
        assert got.tolist() == sent.tolist()
        with pytest.raises(NotImplementedError):
            send.source()


def test_alltoallv_moves_each_ranks_run() -> None:
    with denseccl.init(backend="mpi", timeout=30) as comm:
        sent, got = np.arange(8, dtype=np.uint8), np.zeros(8, dtype=np.uint8)
        comm.transport.alltoallv(sent.ctypes.data, got.ctypes.data, [8], [8]).wait(None)
        assert got.tolist() == sent.tolist()
        empty = np.zeros(0, dtype=np.uint8)  # nothing to move: no address is read
        comm.transport.alltoallv(empty.ctypes.data, empty.ctypes.data, [0], [0]).wait(None)


def test_a_transport_without_them_says_so() -> None:
    class Bare(Transport):
        name = "bare"
        allreduce = reduce = broadcast = allgather = reduce_scatter = barrier = None  # type: ignore[assignment]

    bare = Bare()
    for call, message in ((lambda: bare.alltoallv(0, 0, [], []), "no all-to-all"),
                          (lambda: bare.send(0, 0, 0, 0), "no point-to-point"),
                          (lambda: bare.recv(0, 0, 0, 0), "no point-to-point")):
        with pytest.raises(DenseCCLError, match=message):
            call()
