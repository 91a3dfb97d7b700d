"""The one board channel: :class:`SharedControl` wraps any round (an MPI allreduce, a gloo
group, a key-value store) so that the ranks of a host take the agreement step on their board,
with no message; :func:`open_shared`, the one set-up every launch takes, builds it, or keeps the
round where no board can be made. Across hosts (store launches), each host agrees on its board,
then the hosts' first ranks (the leaders) over a channel of their own (a gloo group), then each
leader posts the answer on its board: per call one leaders' round, never a store operation.
Everything but the agreement step (full descriptors on a mismatch, splits) goes over the round.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

from .. import log
from ..wait import WAITING
from .base import DIFFERENT, MIXED_TAGS, SAME, UNPLANNED, ControlChannel, Flag, GaveUpFlag
from .board import Board
from .hosts import Layout, describe, exchange_about, open_host_board

#: ``(inner, leader, deadline) -> channel``: a channel over the leaders of the hosts (collective
#: over ``inner``: every rank calls it, ``leader`` says whether it is one; None on the others)
Leaders = Callable[[ControlChannel, bool, Optional[float]], Optional[ControlChannel]]


def split_leaders(inner: ControlChannel, leader: bool, deadline: Optional[float]) -> Optional[ControlChannel]:
    """The leaders' channel as a split of ``inner`` (a gloo group for a gloo channel)."""
    return inner.split(0 if leader else None, 0, deadline)


class SharedControl(ControlChannel):
    """The agreement step on this host's board (and among the hosts' leaders), the rest over
    ``inner``, which this channel owns. ``board``: None on a rank alone on its host;
    ``leaders``: the leaders' channel, on a leader of a communicator over several hosts."""

    def __init__(
        self, inner: ControlChannel, board: Optional[Board], leaders: Optional[ControlChannel], layout: Layout,
        make_leaders: Leaders, sleepy: bool = False, doorbells: Any = None,
    ) -> None:
        self.inner = inner
        #: this communicator's doorbells (in its board's segment), forgotten at close
        self.doorbells = doorbells
        self.rank, self.size = inner.rank, inner.size
        self.board = board
        self.leaders = leaders
        self.layout = layout
        self._make_leaders = make_leaders
        self._sleepy = sleepy
        #: this host's ranks share cores (passed on to splits through the layout)
        self.crowded = layout.crowded[layout.mine]
        if len(layout.hosts) == 1 and board is not None:
            #: one host: the board's own step, no delegation on every call
            self.all_equal = board.all_equal  # type: ignore[method-assign, assignment]

    def __repr__(self) -> str:
        return f"<SharedControl {self.path()}>"

    def path(self) -> str:
        """The agreement path in words (logs, the tests)."""
        if len(self.layout.hosts) > 1:  # its board waits always sleep: they last a leaders' round
            among = self.leaders.path() if self.leaders is not None else "this rank is no leader"
            return f"a board per host on {describe(self.layout)}, then one round among their leaders ({among})"
        waits = ", waits sleep" if self.board is not None and self.board.crowded and not self.crowded else ""
        return f"shared-memory board ({self.size} ranks on this host, crowded={self.crowded}{waits})"

    def all_equal(self, value: int, invalid: bool, deadline: Optional[float], tag: int = UNPLANNED) -> int:
        """Across hosts: the host's board, the leaders' round, the leader's answer on the board
        (SAME, MIXED_TAGS or DIFFERENT, as one board would answer for every rank)."""
        board = self.board
        answer = board.all_equal(value, invalid, deadline, tag) if board is not None else DIFFERENT if invalid else SAME
        leader = self.leaders is not None
        if self.leaders is not None:  # a host of mixed tags posts a tag that no other leader posts
            mine = tag if answer == SAME else -2 - self.rank
            answer = self.leaders.all_equal(value, answer == DIFFERENT, deadline, mine)
        if board is not None:  # the leader posts the answer: "invalid" for DIFFERENT, tag 1 for MIXED_TAGS
            answer = board.all_equal(0, leader and answer == DIFFERENT, deadline, int(leader and answer == MIXED_TAGS))
        return answer

    def host_data(self) -> Optional[Board]:
        """The board, where every rank of the channel shares this host and the board has a data
        area (``open_shared``'s ``data_bytes``): a transport may move small calls through it,
        each ordered by the step of its call (``Board.parity``). Else None."""
        one_host = len(self.layout.hosts) == 1
        return self.board if one_host and self.board is not None and self.board.data is not None else None

    def allreduce_max(self, values: Sequence[int], deadline: Optional[float]) -> Sequence[int]:
        return self.inner.allreduce_max(values, deadline)

    def allgather_bytes(self, data: bytes, deadline: Optional[float]) -> Sequence[bytes]:
        return self.inner.allgather_bytes(data, deadline)

    def split(self, color: Optional[int], key: int, deadline: Optional[float]) -> Optional[ControlChannel]:
        part = self.inner.split(color, key, deadline)
        if part is None or part.opened:  # a round whose splits open their own channel (MPI's)
            return part
        return open_shared(part, deadline, self._make_leaders, self._sleepy)

    def give_up(self) -> None:
        """Tell this host's ranks (the board's flag), every rank (the round's news) and, on a
        leader, the other hosts' leaders, which may be waiting for this host in their round."""
        for part in (self.board, self.leaders, self.inner):
            if part is not None:
                part.give_up()

    def peer_gave_up(self) -> Optional[int]:
        """A peer of this host (the board's flag) or, across hosts, of another (the round's news)."""
        here = self.board.gave_up() if self.board is not None else None
        if here is None and len(self.layout.hosts) > 1:
            return self.inner.peer_gave_up()
        return here

    def gave_up_flag(self) -> Flag:
        one_host = len(self.layout.hosts) == 1
        return self.board.flag if self.board is not None and one_host else GaveUpFlag(self.peer_gave_up)

    def abort(self, message: str) -> Any:
        self.inner.abort(message)

    def close(self) -> None:
        WAITING.forget(self.doorbells)
        for part in (self.board, self.leaders, self.inner):
            if part is not None:
                part.close()

    def retire(self) -> None:
        WAITING.forget(self.doorbells)  # a wait still in flight then yields instead of dozing here
        for part in (self.board, self.leaders, self.inner):
            if part is not None:
                part.retire()


def open_shared(
    inner: ControlChannel, deadline: Optional[float], make_leaders: Leaders = split_leaders, sleepy: bool = False,
    data_bytes: Optional[Callable[[int], int]] = None, across_hosts: bool = True,
) -> ControlChannel:
    """The control channel for the ranks of ``inner`` (collective over it): a
    :class:`SharedControl` where every rank can use a board, else ``inner`` itself. Judges
    whether each host is crowded (recorded in ``wait.WAITING``) either way.

    ``sleepy``: the transport's own threads move the data (gloo: its waits block in the
    library), so a rank that reaches the next agreement first must leave the cores to them:
    its board waits give the core up at once and sleep on the host's doorbells, as on a crowded
    host. Spinning there took the cores that gloo's threads needed to finish the peer's
    transfer: a 4 KiB call took 5 ms instead of 0.7 ms on a loaded 2-core machine
    (docs/benchmark.md).

    ``data_bytes``: where the ranks all share one host, the size of the board's data area for
    the transport's small calls, given the host path's limit the ranks agreed on (``Board.data``;
    :meth:`SharedControl.host_data`; none where the limit is 0).

    ``across_hosts``: whether ranks over several hosts get a board per host and a leaders'
    round (else ``inner`` alone: an MPI library's allreduce is already hierarchical)."""
    if inner.size == 1:
        return inner
    layout = exchange_about(inner, deadline)
    crowded = layout.crowded[layout.mine]
    inner.crowded = crowded
    inner.opened = True  # what open_shared returns, the round itself included, is not opened again
    if not layout.usable:
        WAITING.note(crowded)
        log.info("agreement step: %s; no shared board: DENSECCL_SHARED_AGREEMENT off, no fence or no memfd "
                 "on some rank (python -m denseccl says which)", inner.path())
        return inner
    one_host = len(layout.hosts) == 1
    if not one_host and not across_hosts:
        WAITING.note(crowded)
        log.info("agreement step: %s (the ranks span %s)", inner.path(), describe(layout))
        return inner
    area = data_bytes(layout.host_path) if data_bytes is not None and one_host and layout.host_path else 0
    # across hosts a rank's board wait lasts its leader's network round: it sleeps, never spins
    ok, board, doorbells = open_host_board(inner, layout, deadline, sleepy or not one_host, area)
    if not ok:
        return inner
    if board is not None:
        board.progress = inner.progress
    leaders = None
    if not one_host:
        leaders = make_leaders(inner, layout.leaders[layout.mine] == inner.rank, deadline)
    control = SharedControl(inner, board, leaders, layout, make_leaders, sleepy, doorbells)
    control.opened = True
    log.info("agreement step: %s", control.path())
    return control


__all__ = ["Leaders", "SharedControl", "open_shared", "split_leaders"]
