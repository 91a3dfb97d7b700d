"""Threads as the ranks of the shared-memory engine (backends/shm): one board page and one data
area in this process's memory, one ``ShmTransport`` per thread. The GIL orders the threads'
stores (the board's fence is for processes). :class:`Refused` is the fallback engine, which a
call that fits must never reach."""

from __future__ import annotations

import threading
from typing import Any, Callable, List

from denseccl.backends.shm.area import area_bytes
from denseccl.backends.shm.transport import ShmTransport
from denseccl.channel.board import Board, page_bytes
from denseccl.transport import Pending, Transport


class Refused(Transport):
    """A fallback engine that refuses every call: a call of the test fits, so reaching here fails."""

    name = "refused"
    device_memory = False
    dtypes: Any = {}

    def __init__(self, size: int) -> None:
        self.rank, self.size = 0, size

    def _refuse(self, *args: Any, **kwargs: Any) -> Pending:
        raise AssertionError("the call fell back: it should have moved through shared memory")

    allreduce = reduce = broadcast = allgather = reduce_scatter = barrier = _refuse  # type: ignore[assignment]


def engines(size: int, limit: int) -> List[ShmTransport]:
    """``size`` engines over one page and one data area, as ``size`` ranks of one host have."""
    page, data = bytearray(page_bytes(size)), memoryview(bytearray(area_bytes(limit, size)))
    return [ShmTransport(Board(page, rank, size, data=data), limit, Refused(size)) for rank in range(size)]


def on_threads(size: int, work: Callable[[int], Any], timeout: float = 60.0) -> List[Any]:
    """``work(rank)`` on one thread per rank; the results by rank (a thread's error re-raised)."""
    results: List[Any] = [None] * size
    errors: List[BaseException] = []

    def run(rank: int) -> None:
        try:
            results[rank] = work(rank)
        except BaseException as error:  # noqa: BLE001  # re-raised below, on the test's thread
            errors.append(error)

    threads = [threading.Thread(target=run, args=(rank,), daemon=True) for rank in range(size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
    if errors:
        raise errors[0]
    assert not any(thread.is_alive() for thread in threads), "a rank thread is still waiting"
    return results
