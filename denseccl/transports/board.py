"""The arrival board: the agreement step through shared memory when all ranks share a host.

The agreement asks one question per collective: does every rank hold this digest, and is no
rank's input invalid? Over MPI that is a tiny allreduce, whose setup in the MPI library costs
about as much as the 4 KiB collective it guards. When every rank runs on one host, the ranks
answer it through a shared page instead: each rank writes ``(digest, invalid)`` and then the
call's sequence number into its own cache line, and reads its peers' lines once their sequence
number has arrived.

A last line holds a flag: the rank (plus one) that gave up on a call (a timeout). That rank
also retracts its entries, so that no late peer agrees with an entry of the abandoned call,
and a peer waiting on the board, or checking after its transfer, fails at once.

Two sets of lines, used by alternate calls, make that safe without a second handshake: a rank
rewrites a line for call ``k + 2`` only after it has seen every peer arrive at call ``k + 1``,
and a peer arrives there only after it has read everything of call ``k``.

Reading a peer's values after its sequence number relies on stores becoming visible in program
order (x86-64's total store order); other processors use the MPI path. The page is a file in
``/dev/shm`` that rank 0 creates and unlinks as soon as every rank has mapped it, so nothing
is left behind and closing is local.
"""

from __future__ import annotations

import mmap
import os
import platform
import time
from typing import Any, Callable, Optional

from .. import config
from ..errors import peer_gave_up_error
from .base import wait_until

#: 64-bit words per rank and call parity: one cache line (sequence, digest, invalid, padding)
LINE = 8
#: where the page lives; a RAM-backed filesystem every rank of a host sees
DIRECTORY = "/dev/shm"
#: reads of a peer's line before the wait starts yielding the core (about a millisecond)
SPINS = 20000
#: the same when the host runs more ranks than it has cores: a spinning rank would keep the
#: peer it waits for off the core
CROWDED_SPINS = 16
_TSO_MACHINES = {"x86_64", "amd64", "i686", "i386"}


def usable_here() -> bool:
    """Whether this host can use a board: ordered stores and a shared-memory directory, and
    not switched off with ``DENSECCL_SHARED_AGREEMENT=0``."""
    if not config.settings().shared_agreement:
        return False
    return platform.machine().lower() in _TSO_MACHINES and os.path.isdir(DIRECTORY)


class Board:
    """One communicator's board: ``all_equal`` is the agreement step for its ``size`` ranks."""

    def __init__(self, mapping: mmap.mmap, rank: int, size: int, crowded: bool = False) -> None:
        self.rank = rank
        self.size = size
        #: more ranks on this host than cores: waits yield the core at once
        self.crowded = crowded
        self._spins = CROWDED_SPINS if crowded else SPINS
        self._mapping = mapping
        self._words = memoryview(mapping).cast("q")
        self._sequence = 0
        #: drives the MPI library's progress while a wait lasts (Board.open sets an Iprobe)
        self.progress: Optional[Callable[[], Any]] = None
        #: the word of the "gave up" flag: 0, or the rank that gave up plus one
        self._flag = 2 * size * LINE
        #: that word alone, for a check with no call: nonzero once a rank gave up
        self.flag = self._words[self._flag : self._flag + 1]
        #: per call parity: (the start of my line, the starts of my peers' lines)
        self._lines = tuple(
            (base + rank * LINE, tuple(base + peer * LINE for peer in range(size) if peer != rank))
            for base in (0, size * LINE)
        )

    @classmethod
    def open(cls, comm: Any, crowded: Optional[bool] = None) -> Optional["Board"]:
        """A board for the mpi4py communicator ``comm`` (collective over ``comm``), or None where
        its ranks do not all share this host's memory or the host cannot use one. ``crowded``:
        whether the host runs more ranks than cores (a split passes its parent's; by default,
        ``comm``'s ranks against the host's cores)."""
        from mpi4py import MPI  # noqa: PLC0415 - the board is built on an MPI communicator

        rank, size = comm.Get_rank(), comm.Get_size()
        node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
        together = node.Get_size() == size
        node.Free()
        if crowded is None:
            crowded = size > (os.cpu_count() or 1)
        if not comm.allreduce(together and usable_here(), op=MPI.LAND):
            return None
        path = None
        if rank == 0:
            try:
                path = _create(page_bytes(size))
            except OSError:
                pass  # no board: the agreement takes the MPI path
        path = comm.bcast(path, root=0)
        board = None
        if path is not None:
            try:
                board = _map(path, rank, size, crowded)
            except OSError:
                pass
        if board is not None:  # every rank writes its cookie, then checks everyone's
            board._words[rank * LINE + 1] = _cookie(rank)
        comm.Barrier()
        if rank == 0 and path is not None:
            os.unlink(path)
        seen = board is not None and all(board._words[p * LINE + 1] == _cookie(p) for p in range(size))
        if not comm.allreduce(seen, op=MPI.LAND):
            if board is not None:
                board.close()
            return None
        board.progress = comm.Iprobe  # any MPI call progresses every request of this process
        return board  # the first call uses the other parity's lines: the cookies may stay

    def all_equal(self, value: int, invalid: bool, deadline: Optional[float]) -> bool:
        """Post ``(value, invalid)``; True when every rank posted ``value`` and none is invalid.
        Every rank gets the same answer. :class:`CollectiveTimeoutError` past ``deadline``."""
        sequence = self._sequence = self._sequence + 1
        mine, peers = self._lines[sequence & 1]
        words = self._words
        words[mine + 1] = value
        words[mine + 2] = 1 if invalid else 0
        words[mine] = sequence  # last: a peer that sees it sees the values too
        same = not invalid
        for line in peers:
            if words[line] != sequence:
                self._wait(line, sequence, deadline)
            if words[line + 1] != value or words[line + 2]:
                same = False
        return same

    def _wait(self, line: int, sequence: int, deadline: Optional[float]) -> None:
        words = self._words
        for _ in range(self._spins):  # inline: a peer that is already there costs no call
            if words[line] == sequence:
                return
        progress = self.progress

        flag = self._flag

        def arrived() -> bool:
            # MPI moves this rank's nonblocking transfers only inside MPI calls, and the peer
            # may be waiting for one of them before it can get here
            if progress is not None:
                progress()
            if words[flag]:
                raise peer_gave_up_error(words[flag] - 1)
            return words[line] == sequence

        wait_until(arrived, deadline, "the agreement step", spins=0)

    def give_up(self) -> None:
        """Raise the flag for this rank and retract its entries (see the module's docstring)."""
        words = self._words
        if not words[self._flag]:
            words[self._flag] = self.rank + 1
        for mine, _ in self._lines:
            words[mine] = -1

    def gave_up(self) -> Optional[int]:
        """The rank that gave up on a call, or None."""
        who = self._words[self._flag]
        return who - 1 if who else None

    def close(self) -> None:
        """Unmap the page (local: peers need not take part)."""
        if self._mapping.closed:
            return
        self.flag.release()
        self._words.release()
        self._mapping.close()


def page_bytes(size: int) -> int:
    """Bytes of the page: two lines per rank, then the flag's line."""
    return (2 * size + 1) * LINE * 8


def _create(length: int) -> str:
    """A new zero-filled file of ``length`` bytes in :data:`DIRECTORY`; its path."""
    for attempt in range(100):
        path = os.path.join(DIRECTORY, f"denseccl-board-{os.getpid()}-{time.monotonic_ns()}-{attempt}")
        try:
            descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            continue
        try:
            os.ftruncate(descriptor, length)
        finally:
            os.close(descriptor)
        return path
    raise OSError(f"could not create a board file in {DIRECTORY}")


def _map(path: str, rank: int, size: int, crowded: bool) -> Board:
    descriptor = os.open(path, os.O_RDWR)
    try:
        mapping = mmap.mmap(descriptor, page_bytes(size))
    finally:
        os.close(descriptor)
    return Board(mapping, rank, size, crowded)


def _cookie(rank: int) -> int:
    """What rank ``rank`` writes into its line at setup: seeing every rank's proves the ranks
    share the page (and not merely a file name)."""
    return (rank + 1) * 0x9E3779B1
