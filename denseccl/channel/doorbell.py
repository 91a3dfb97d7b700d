"""Doorbells: how ranks that share cores wait for each other without polling.

Why: on a crowded host (cores.py) a rank that polls burns the time its peer needs. A crowded
wait yields after each short burst of polls (wait.wait_until), so a small call completes within
a few turns; a longer wait (a slow or stalled peer) must not keep the core busy with yields, so
it raises its ``asleep`` flag, tests once more, and sleeps on its doorbell (a futex in the
host's shared segment, beside the board, with a short timeout). A rank
rings sleeping peers before the first sleep of a wait, after it posts an agreement and when one
of its waits ends: whatever a peer waits for was made by one of those steps. A missed wake-up
costs at most :data:`config.NAP_SECONDS`, never a hang. Linux futexes through ``syscall(2)``
on the processors of :data:`FUTEX_SYSCALL`; elsewhere (and where no shared page can be made)
crowded waits yield instead.
"""

from __future__ import annotations

import ctypes
import platform
import sys
from typing import Any, Callable, Optional

from .. import config

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


class _Timespec(ctypes.Structure):
    _fields_ = [("seconds", ctypes.c_long), ("nanoseconds", ctypes.c_long)]


def _timespec(seconds: float) -> _Timespec:
    whole = int(seconds)
    return _Timespec(whole, int((seconds - whole) * 1e9))


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
    (``size * WORDS`` 32-bit words, zeroed); ``fence``: the full memory barrier between raising
    a flag and testing (fence.py's). The view of ``memory`` keeps its mapping alive."""

    def __init__(
        self, memory: Any, address: int, rank: int, size: int, futex: Callable[..., int], fence: Callable[[], Any]
    ) -> None:
        self.rank = rank
        self.size = size
        self._words = memoryview(memory).cast("B").cast("i")
        self._address = address
        self._futex = futex
        self._fence = fence
        self._mine = rank * WORDS
        self._peers = tuple(peer * WORDS for peer in range(size) if peer != rank)
        self._naps = tuple(_timespec(nap) for nap in (config.NAP_SECONDS, config.IDLE_NAP_SECONDS))

    def ring(self) -> None:
        """Wake every peer that sleeps (cheap when none does: a barrier and a read per peer)."""
        words = self._words
        self._fence()  # what this rank did before, then the flags
        for peer in self._peers:
            if words[peer + 1]:
                words[peer] += 1
                self._futex(ctypes.c_void_p(self._address + 4 * peer), _FUTEX_WAKE, 1 << 30, None, None, 0)

    def doze(self, test: Callable[[], bool], idle: bool = False) -> bool:
        """Sleep until a peer rings or the nap ends (:data:`config.IDLE_NAP_SECONDS` where ``idle``,
        else :data:`config.NAP_SECONDS`), unless ``test()`` is already true (tested
        after the flag is up: a peer that makes it true afterwards sees the flag and rings).
        Returns the last test's result (False after a sleep). It rings no peer: two ranks that
        both wait for a third would otherwise wake each other over and over; the caller rings
        once before its first doze of a wait (:func:`denseccl.wait.wait_until`)."""
        words, mine = self._words, self._mine
        rings = words[mine]
        words[mine + 1] = 1
        self._fence()  # the flag, then the test
        try:
            if test():
                return True
            nap = ctypes.byref(self._naps[idle])
            self._futex(ctypes.c_void_p(self._address + 4 * mine), _FUTEX_WAIT, rings, nap, None, 0)
            return False
        finally:
            words[mine + 1] = 0
