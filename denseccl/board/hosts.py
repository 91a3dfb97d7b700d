"""Which ranks of a communicator share a host, and their board, set up without MPI.

Why: under torchrun, ``mp.spawn``, Lightning or Ray the ranks meet on a key-value store and
share nothing else; the agreement step would then be a gloo round trip or four store operations
per call. Once, when a communicator is made, its ranks exchange over its control channel
(whose own setup went through the store) who they are:

- their host: the host name, the boot id (``/proc/sys/kernel/random/boot_id``) and the identity
  of the /dev/shm they see (segment.py): ranks share a board only when all three agree, so
  containers or simulated hosts with a /dev/shm of their own are told apart;
- their placement (affinity mask, cgroup quota: cores.py) for the crowded judgement;
- what they can do: boards on (``DENSECCL_SHARED_AGREEMENT``), a fence (fence.py), a futex.

Then the first rank of each host creates the host's segment (segment.py) and passes its name
in a second exchange; every other rank of the host maps it; a third exchange says that every
rank attached, and the name is unlinked at once (on an error too). Every decision is made from
what every rank sent, so every rank takes the same path: boards on every host, or none.
"""

from __future__ import annotations

import json
import mmap
import socket
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..backends.base import ControlChannel
from ..wait import WAITING
from . import segment
from .board import Board, page_bytes, usable_here
from .cores import Placement, judge, local_placement
from .doorbell import WORDS, Doorbells, futex_call
from .fence import page_fence

#: the data area starts on a page of its own
PAGE = mmap.PAGESIZE

BOOT_ID = "/proc/sys/kernel/random/boot_id"


def _boot_id() -> str:
    try:
        with open(BOOT_ID) as handle:
            return handle.read().strip()
    except OSError:
        return ""


def about_me() -> Dict[str, Any]:
    """What this rank tells its peers at setup."""
    placement = local_placement()
    shm = segment.identity() if segment.available() else ""
    return {
        "host": socket.gethostname(),
        "where": f"{_boot_id()}/{shm}" if shm else "",
        "cpus": sorted(placement.cpus),
        "cgroup": placement.cgroup,
        "limit": placement.limit,
        "board": usable_here() and page_fence() is not None and bool(shm),
        "futex": futex_call() is not None,
    }


@dataclass(frozen=True)
class Layout:
    """The hosts of a communicator, the same on every rank."""

    #: the ranks of each host, in rank order; hosts ordered by their first rank
    hosts: Tuple[Tuple[int, ...], ...]
    #: the index of this rank's host
    mine: int
    #: whether every rank can use a board (else none does)
    usable: bool
    #: per host: whether its ranks cannot each have a core of their own
    crowded: Tuple[bool, ...]
    #: per host: whether every rank of it has a futex
    futex: Tuple[bool, ...]

    @property
    def ranks(self) -> Tuple[int, ...]:
        """This rank's host's ranks."""
        return self.hosts[self.mine]

    @property
    def leaders(self) -> Tuple[int, ...]:
        """The first rank of each host."""
        return tuple(host[0] for host in self.hosts)


def plan(entries: Sequence[Dict[str, Any]], rank: int) -> Layout:
    """The :class:`Layout` from every rank's :func:`about_me` (indexed by rank)."""
    groups: Dict[Tuple[str, str], List[int]] = {}
    for r, entry in enumerate(entries):
        # a rank whose /dev/shm cannot be told is a host of its own
        where = entry["where"] or f"alone/{r}"
        groups.setdefault((entry["host"], where), []).append(r)
    hosts = tuple(sorted((tuple(members) for members in groups.values()), key=lambda members: members[0]))
    mine = next(i for i, members in enumerate(hosts) if rank in members)
    crowded = tuple(
        judge([Placement(frozenset(entries[r]["cpus"]), entries[r]["cgroup"], entries[r]["limit"]) for r in members])
        for members in hosts
    )
    futex = tuple(all(entries[r]["futex"] for r in members) for members in hosts)
    return Layout(hosts, mine, all(entry["board"] for entry in entries), crowded, futex)


def open_host_board(
    channel: ControlChannel, layout: Layout, deadline: Optional[float], sleepy: bool = False, data_bytes: int = 0
) -> Tuple[bool, Optional[Board]]:
    """Over ``channel`` (collective): every host's segment, created by its first rank, mapped by
    the others, unlinked once all have. ``(ok, board)``: ok on every rank or on none; the board
    is None on a rank alone on its host. Records the host's crowding (and its doorbells) in
    ``wait.WAITING``; ``sleepy``: wait as on a crowded host whatever the judgement (see
    control.open_shared). ``data_bytes``: the size of the board's data area (``Board.data``,
    page-aligned, after the page and the doorbells; none when 0)."""
    ranks = layout.ranks
    local, size = ranks.index(channel.rank), len(ranks)
    crowded = layout.crowded[layout.mine] or sleepy
    bells = page_bytes(size) + size * WORDS * 4
    data_start = -(-bells // PAGE) * PAGE
    nbytes = data_start + data_bytes if data_bytes else bells
    fence = page_fence()
    made: Optional[segment.Segment] = None
    name: Optional[str] = None
    try:
        if size > 1 and local == 0:
            made = segment.Segment.create(nbytes)
            name = made.name
        names = channel.allgather_bytes((name or "").encode(), deadline)
        ok = True
        if size > 1 and local != 0:
            name = names[ranks[0]].decode()
            try:
                made = segment.Segment.attach(name, nbytes)
            except OSError:
                ok = False
        every = channel.allgather_bytes(b"1" if ok else b"0", deadline)
    finally:
        segment.unlink(name)  # every rank of the host has attached, or the setup failed
    if not all(flag == b"1" for flag in every):
        if made is not None:
            made.close()
        return False, None
    if made is None:
        WAITING.note(crowded)
        return True, None
    assert fence is not None  # layout.usable: every rank has one
    data = made.view(data_start, nbytes) if data_bytes else None
    board = Board(made.view(0, page_bytes(size)), local, size, crowded, fence, owner=made, data=data)
    doorbells = None
    futex = futex_call()
    if crowded and layout.futex[layout.mine] and futex is not None:
        start = page_bytes(size)
        doorbells = Doorbells(made.view(start, bells), made.address + start, local, size, futex, fence, made)
    WAITING.note(crowded, doorbells)
    return True, board


def exchange_about(channel: ControlChannel, deadline: Optional[float]) -> Layout:
    """The first exchange of the setup (collective over ``channel``)."""
    raw = channel.allgather_bytes(json.dumps(about_me()).encode(), deadline)
    return plan([json.loads(entry) for entry in raw], channel.rank)


def describe(layout: Layout) -> str:
    """The hosts in words, for the log: ``2 hosts (2+2 ranks)``."""
    counts = "+".join(str(len(host)) for host in layout.hosts)
    return f"{len(layout.hosts)} host{'s' * (len(layout.hosts) > 1)} ({counts} ranks)"


__all__ = ["Layout", "about_me", "describe", "exchange_about", "open_host_board", "plan"]
