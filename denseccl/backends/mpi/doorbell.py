"""Doorbells: how ranks that share cores wait for each other without polling.

Why: on a crowded host (cores.py) a rank that polls burns the time its peer needs. A crowded
wait yields after each short burst of polls (wait.wait_until), so a small call completes within
a few turns; a longer wait (a slow or stalled peer) must not keep the core busy with yields, so
it raises its ``asleep`` flag, tests once more, and sleeps on its doorbell (a futex in an MPI
shared window, with a short timeout). A rank rings sleeping peers before the first sleep of a
wait, after it posts an agreement and when one of its waits ends: whatever a peer waits for was
made by one of those steps. A missed wake-up costs at most :data:`config.NAP_SECONDS`, never a
hang. Linux futexes through ``syscall(2)`` on the processors of :data:`FUTEX_SYSCALL`; elsewhere
(and where the MPI library cannot make a shared window) crowded waits yield instead.
"""

from __future__ import annotations

import ctypes
import platform
import sys
from typing import Any, Callable, List, Optional

from ... import config

#: the futex system call's number per processor (Linux), by the names ``platform.machine()`` gives
FUTEX_SYSCALL = {
    **dict.fromkeys(("x86_64", "amd64"), 202),
    **dict.fromkeys(("aarch64", "arm64", "riscv64"), 98),
    **dict.fromkeys(("ppc64le", "ppc64"), 221),
    "s390x": 238,
    **dict.fromkeys(("i686", "i386", "armv7l"), 240),
}
_FUTEX_WAIT, _FUTEX_WAKE = 0, 1  # shared between processes: not the _PRIVATE variants
#: 32-bit words per rank, one cache line: (rings, asleep)
WORDS = 16
#: windows given up (doorbells replaced by a larger host's, closed boards): ``Win.Free`` is
#: collective, so they live until the process ends
RETIRED: List[Any] = []


class _Timespec(ctypes.Structure):
    _fields_ = [("seconds", ctypes.c_long), ("nanoseconds", ctypes.c_long)]


def futex_call() -> Optional[Callable[..., int]]:
    """``syscall`` bound to the futex call, or None where this system has none we know."""
    number = FUTEX_SYSCALL.get(platform.machine().lower())
    if number is None or not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        syscall = libc.syscall
    except (OSError, AttributeError):
        return None
    syscall.restype = ctypes.c_long
    futex_number = ctypes.c_long(number)
    return lambda *arguments: syscall(futex_number, *arguments)


class Doorbells:
    """The doorbells of one host's ``size`` ranks in shared ``memory`` at ``address``
    (``size * WORDS`` 32-bit words, zeroed); ``sync``: the memory barrier between raising a
    flag and testing (``Win.Sync``)."""

    def __init__(
        self,
        memory: Any,
        address: int,
        rank: int,
        size: int,
        futex: Callable[..., int],
        sync: Callable[[], Any],
        window: Any = None,
    ) -> None:
        self.rank = rank
        self.size = size
        self._words = memoryview(memory).cast("B").cast("i")
        self._address = address
        self._futex = futex
        self._sync = sync
        self._window = window
        self._mine = rank * WORDS
        self._peers = tuple(peer * WORDS for peer in range(size) if peer != rank)
        seconds = int(config.NAP_SECONDS)
        self._nap = _Timespec(seconds, int((config.NAP_SECONDS - seconds) * 1e9))

    @classmethod
    def open(cls, node: Any) -> Optional["Doorbells"]:
        """Doorbells for the ranks of ``node``, an mpi4py communicator of one host (collective);
        None where this system has no futex or the MPI library no shared window."""
        from mpi4py import MPI  # noqa: PLC0415 - the page comes from the MPI library

        futex = futex_call()
        size = node.Get_size()
        if not node.allreduce(futex is not None, op=MPI.LAND):
            return None
        window = shared_window(node, size * WORDS * 4, 4)
        if window is None:
            return None
        memory, _ = window.Shared_query(0)
        return cls(memory, memory.address, node.Get_rank(), size, futex, window.Sync, window)  # type: ignore[arg-type]

    def ring(self) -> None:
        """Wake every peer that sleeps (cheap when none does: a barrier and a read per peer)."""
        words = self._words
        self._sync()  # what this rank did before, then the flags
        for peer in self._peers:
            if words[peer + 1]:
                words[peer] += 1
                self._futex(ctypes.c_void_p(self._address + 4 * peer), _FUTEX_WAKE, 1 << 30, None, None, 0)

    def doze(self, test: Callable[[], bool]) -> bool:
        """Sleep until a peer rings or the nap ends, unless ``test()`` is already true (tested
        after the flag is up: a peer that makes it true afterwards sees the flag and rings).
        Returns the last test's result (False after a sleep). It rings no peer: two ranks that
        both wait for a third would otherwise wake each other over and over; the caller rings
        once before its first doze of a wait (:func:`denseccl.wait.wait_until`)."""
        words, mine = self._words, self._mine
        rings = words[mine]
        words[mine + 1] = 1
        self._sync()  # the flag, then the test
        try:
            if test():
                return True
            self._futex(ctypes.c_void_p(self._address + 4 * mine), _FUTEX_WAIT, rings, ctypes.byref(self._nap), None, 0)
            return False
        finally:
            words[mine + 1] = 0

    def retire(self) -> None:
        """Stop using these doorbells (local; ``Win.Free`` would wait for every rank)."""
        if self._window is not None:
            RETIRED.append(self._window)
            self._window = None


def shared_window(node: Any, nbytes: int, unit: int) -> Any:
    """An MPI shared window of ``nbytes`` (in units of ``unit`` bytes), all of it on the first
    rank of ``node`` (an mpi4py communicator of one host), zeroed before anyone reads it, in a
    passive-target epoch that lasts the window's life (what ``Win.Sync`` needs). None on every
    rank where the MPI library cannot make one in the unified memory model (loads and stores
    would not see the window's public copy). Collective over ``node``."""
    from mpi4py import MPI  # noqa: PLC0415

    try:
        window: Any = MPI.Win.Allocate_shared(nbytes if node.Get_rank() == 0 else 0, unit, comm=node)
    except MPI.Exception:
        window = None
    if not node.allreduce(window is not None and window.model == MPI.WIN_UNIFIED, op=MPI.LAND):
        if window is not None:
            RETIRED.append(window)
        return None
    window.Lock_all(MPI.MODE_NOCHECK)
    if node.Get_rank() == 0:
        memory, _ = window.Shared_query(0)
        view = memoryview(memory).cast("B")
        view[:nbytes] = bytes(nbytes)
        view.release()
    window.Sync()
    node.Barrier()
    window.Sync()
    return window
