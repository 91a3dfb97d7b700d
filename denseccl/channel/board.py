"""The arrival board: the agreement step through shared memory when ranks share a host.

Why: a control-channel message per call (an MPI allreduce, a gloo round trip, key-value store
operations) costs as much as, or far more than, the small collective it guards. On one host the
ranks answer the agreement step through a shared page instead: each rank writes
``(digest, invalid, tag)`` and then the call's sequence number into its own cache line, and
reads a peer's line once its sequence number has arrived. A last line holds a flag: the rank
(plus one) that gave up on a call (a timeout, an interrupt). That rank also retracts its entries, so that no
late peer agrees with an entry of the abandoned call, and a waiting peer fails at once.

Two sets of lines serve alternate calls: a rank rewrites a line for call ``k + 2`` only after
every peer arrived at call ``k + 1``, hence has read everything of call ``k``.

The protocol is written once, over *a page and a fence* (segment.py's memfd and fence.py's
compiled fence; in the unit tests, threads' memory). Ordering relied on: a fence
between writing a line's values and publishing its sequence number (release), and between
seeing every peer's number and reading their values (acquire). No processor's store order is
assumed beyond what the provider's fence gives.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Optional

from .. import config
from ..errors import peer_gave_up_error
from ..wait import WAITING, wait_until
from .base import DIFFERENT, MIXED_TAGS, SAME, UNPLANNED

#: 64-bit words per rank and call parity: one cache line (sequence, digest, invalid, tag, padding)
LINE = 8
#: the turns of a crowded wait for a peer's post before the full wait
TURNS = range(config.CROWDED_TURNS)


def usable_here() -> bool:
    """Whether boards are on (``DENSECCL_SHARED_AGREEMENT``, default on); the processor's
    ordering is the provider's concern (its fence)."""
    return config.settings().shared_agreement


class Board:
    """One communicator's board: ``all_equal`` is the agreement step for its ``size`` ranks.

    ``memory``: a writable buffer of :func:`page_bytes` that every rank maps, zeroed;
    ``fence``: the full memory barrier that orders its stores and loads across ranks (the
    fence.py's, or none between threads); ``owner``: the segment that provides ``memory``
    (segment.py), closed with the board. ``data``: shared memory beside the page that a transport moves
    small calls through, ordered by the board's steps (backends/shm), or None."""

    def __init__(
        self,
        memory: Any,
        rank: int,
        size: int,
        crowded: bool = False,
        fence: Optional[Callable[[], Any]] = None,
        owner: Any = None,
        data: Optional[memoryview] = None,
        member: Optional[int] = None,
    ) -> None:
        self.rank = rank
        self.size = size
        #: this rank in its communicator (``rank`` is its place on this host's board): the
        #: flag names it, so that every rank's error names the same rank
        self.member = rank if member is None else member
        #: the shared data area ordered by this board's steps, or None
        self.data = data
        #: the host's ranks cannot each have a core of their own (cores.py): waits yield at once
        self.crowded = crowded
        self._spins = 0 if crowded else config.BOARD_SPINS
        self._words = memoryview(memory).cast("B").cast("q")
        self._fence = fence if fence is not None else _no_barrier
        self._owner = owner
        self._sequence = 0
        #: drives the library's progress while a wait lasts (an MPI board sets an Iprobe)
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

    def all_equal(self, value: int, invalid: bool, deadline: Optional[float], tag: int = UNPLANNED) -> int:
        """Post ``(value, invalid, tag)``; the answer of :meth:`ControlChannel.all_equal`
        (SAME, MIXED_TAGS or DIFFERENT), the same on every rank.
        :class:`CollectiveTimeoutError` past ``deadline``."""
        sequence = self._sequence = self._sequence + 1
        mine, peers = self._lines[sequence & 1]
        words = self._words
        words[mine + 1] = value
        words[mine + 2] = 1 if invalid else 0
        words[mine + 3] = tag
        self._fence()  # the values before the sequence number
        words[mine] = sequence  # a peer that sees it sees the values too
        if self.crowded:  # a peer may sleep waiting for this sequence number
            WAITING.ring()
        for line in peers:
            if words[line] != sequence:
                if self.crowded:  # the peer that must post shares this core: let it run, a few times
                    for _ in TURNS:
                        os.sched_yield()
                        if words[line] == sequence:
                            break
                if words[line] != sequence:
                    self._wait(line, sequence, deadline)
        self._fence()  # every peer's values after its sequence number
        if invalid:
            return DIFFERENT
        answer = SAME
        for line in peers:
            if words[line + 1] != value or words[line + 2]:
                return DIFFERENT
            if words[line + 3] != tag:
                answer = MIXED_TAGS
        return answer

    def parity(self) -> int:
        """The parity (0 or 1) of the next step's sequence number. Data written into half
        ``parity()`` of a double-buffered area before the next step is seen by every peer once
        that step returns, and stays until this rank's step after the one that follows it (as
        the lines: a peer that arrived at the step after has read everything of this one)."""
        return (self._sequence + 1) & 1

    def _wait(self, line: int, sequence: int, deadline: Optional[float]) -> None:
        words = self._words
        for _ in range(self._spins):  # inline: a peer that is already there costs no call
            if words[line] == sequence:
                return
        progress, fence, flag = self.progress, self._fence, self._flag

        def arrived() -> bool:
            # MPI moves this rank's nonblocking transfers only inside MPI calls, and the peer
            # may be waiting for one of them before it can get here
            if progress is not None:
                progress()
            fence()
            if words[flag]:
                raise peer_gave_up_error(words[flag] - 1)
            return words[line] == sequence

        wait_until(arrived, deadline, "the agreement step", spins=0, burst=1)

    def give_up(self) -> None:
        """Raise the flag for this rank and retract its entries (see the module's docstring)."""
        words = self._words
        if not words[self._flag]:
            words[self._flag] = self.member + 1
        for mine, _ in self._lines:
            words[mine] = -1
        self._fence()  # out to the peers now
        WAITING.ring()  # a peer asleep on its doorbell sees the flag at once

    def gave_up(self) -> Optional[int]:
        """The rank (in the communicator) that gave up on a call, or None."""
        who = self._words[self._flag]
        return who - 1 if who else None

    def close(self) -> None:
        """Stop using the page (local: peers need not take part)."""
        self.flag.release()  # idempotent
        self._words.release()
        self.data = None
        self.retire()

    def retire(self) -> None:
        """Stop using the page while a wait may still read the flag (a Work in flight when its
        communicator closed): the views stay readable, and they keep the page mapped."""
        owner, self._owner = self._owner, None
        if owner is not None:
            owner.close()


def page_bytes(size: int) -> int:
    """Bytes of the page: two lines per rank, then the flag's line."""
    return (2 * size + 1) * LINE * 8


def _no_barrier() -> None:
    """Threads of one process (the unit tests) need no barrier of their own: the GIL orders them."""
