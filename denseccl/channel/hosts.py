"""Which ranks of a communicator share a host, and their board, set up once over the launch's
round (MPI's, gloo's, a store's) when the communicator is made. The ranks first exchange:

- their host: host name, boot id (``/proc/sys/kernel/random/boot_id``) and network namespace,
  where the hand-over socket lives (segment.py), so that containers or simulated hosts with a
  network of their own are told apart;
- their placement (affinity mask, cgroup quota: cores.py) for the crowded judgement;
- what they can do: boards on (``DENSECCL_SHARED_AGREEMENT``), a fence (fence.py), a futex, and
  the host path's limit (``DENSECCL_HOST_PATH``: the smallest wins).

Then each host's first rank makes its segment and announces its socket; the others connect and
say so; the first rank hands the segment to each, and a last exchange says whether every rank
mapped it. Any failure (where memory is short, the data area is left out first) is "no shared
memory" on every rank, which then agree through the round. Every decision is made from what
every rank sent, so every rank takes the same path: boards on every host, or none.
"""

from __future__ import annotations

import json
import mmap
import os
import socket
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .. import config, log
from ..wait import WAITING
from . import segment
from .base import ControlChannel
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
    network = segment.identity() if segment.available() else ""
    return {
        "host": socket.gethostname(),
        "where": f"{_boot_id()}/{network}" if network else "",
        "cpus": sorted(placement.cpus),
        "cgroup": placement.cgroup,
        "limit": placement.limit,
        "board": usable_here() and page_fence() is not None and bool(network),
        "futex": futex_call() is not None,
        "host_path": config.settings().host_path,
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
    #: the host path's limit in bytes, the smallest any rank asked for (0: off)
    host_path: int = 0

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
    host_path = min(int(entry.get("host_path", 0)) for entry in entries)
    return Layout(hosts, mine, all(entry["board"] for entry in entries), crowded, futex, host_path)


def open_host_board(
    channel: ControlChannel, layout: Layout, deadline: Optional[float], sleepy: bool = False, data_bytes: int = 0
) -> Tuple[bool, Optional[Board], Optional[Doorbells]]:
    """Over ``channel`` (collective): every host's segment, made by its first rank and handed
    to the others (module docstring). ``(ok, board, doorbells)``: ok on every rank or on none;
    the board is None on a rank alone on its host. Records the host's crowding (and its
    doorbells, which the caller forgets at close) in ``wait.WAITING``; ``sleepy``: wait as on a
    crowded host whatever the judgement (see shared.open_shared). ``data_bytes``: the size of
    the board's data area wanted (``Board.data``, page-aligned, after the page and the doorbells;
    the segment is made without one where there is no room for it)."""
    ranks = layout.ranks
    local, size = ranks.index(channel.rank), len(ranks)
    crowded = layout.crowded[layout.mine] or sleepy
    bells = page_bytes(size) + size * WORDS * 4
    data_start = -(-bells // PAGE) * PAGE
    made: Optional[segment.Segment] = None
    handout: Optional[segment.Handout] = None
    connection: Optional[socket.socket] = None
    failure = ""
    try:
        if size > 1 and local == 0:
            handout, made, data_bytes, failure = _make(bells, data_start, data_bytes, size)
        announced = f"{handout.name} {data_bytes}" if handout is not None else ""
        names = channel.allgather_bytes(announced.encode(), deadline)
        if size > 1 and local != 0:
            name, _, area = names[ranks[0]].decode().partition(" ")
            data_bytes = int(area or 0)
            try:
                connection = segment.connect(name)  # an empty name: the first rank made none
            except OSError as error:
                failure = f"cannot reach the host's first rank's segment: {error}"
        connected = channel.allgather_bytes(b"" if failure else b"1", deadline)
        nbytes = data_start + data_bytes if data_bytes else bells
        try:
            if handout is not None:
                try:
                    handout.give(sum(1 for r in ranks[1:] if connected[r]), deadline)
                finally:  # a peer still waiting for the segment then reads the end of its connection
                    handout.close()
            if connection is not None:
                made = segment.receive(connection, nbytes, deadline)
        except OSError as error:
            failure = f"cannot hand the segment over: {error}"
        every = channel.allgather_bytes(failure.encode(), deadline)
    finally:
        for end in (handout, connection):
            if end is not None:
                end.close()
    reasons = sorted({reason.decode() for reason in every if reason})
    if reasons:
        WAITING.note(layout.crowded[layout.mine])
        if made is not None:
            made.close()
        (log.warning if channel.rank == 0 else log.info)(
            "no shared memory for the agreement board (%s): the agreement step goes over %s instead",
            "; ".join(reasons), channel.path())
        return False, None, None
    if made is None:
        WAITING.note(crowded)
        return True, None, None
    fence = page_fence()
    assert fence is not None  # layout.usable: every rank has one
    data = made.view(data_start, data_start + data_bytes) if data_bytes else None
    board = Board(
        made.view(0, page_bytes(size)), local, size, crowded, fence, owner=made, data=data, member=channel.rank
    )
    doorbells = None
    futex = futex_call()
    if crowded and layout.futex[layout.mine] and futex is not None:
        start = page_bytes(size)
        doorbells = Doorbells(made.view(start, bells), made.address + start, local, size, futex, fence)
    WAITING.note(crowded, doorbells)
    return True, board, doorbells


def _make(bells: int, data_start: int, data_bytes: int, size: int) -> Tuple[Any, Any, int, str]:
    """The host's segment, mapped and ready to hand over: ``(handout, segment, data bytes, why
    none)``. Without its data area where there is no room for it (one log line)."""
    nbytes = data_start + data_bytes if data_bytes else bells
    try:
        descriptor = segment.Segment.make(nbytes)
    except OSError as error:
        if not data_bytes:
            return None, None, 0, f"no memory for a segment of {bells} bytes: {error}"
        log.warning("the host path is off: no memory for its %d bytes of shared memory (%s)", data_bytes, error)
        return _make(bells, data_start, 0, size)
    try:
        handout = segment.Handout(descriptor, size)
    except OSError as error:
        os.close(descriptor)
        return None, None, 0, f"no socket to hand the segment over: {error}"
    try:
        return handout, segment.Segment.map_descriptor(descriptor, nbytes), data_bytes, ""
    except OSError as error:
        handout.close()
        return None, None, 0, f"cannot map the segment made: {error}"


def exchange_about(channel: ControlChannel, deadline: Optional[float]) -> Layout:
    """The first exchange of the setup (collective over ``channel``)."""
    raw = channel.allgather_bytes(json.dumps(about_me()).encode(), deadline)
    return plan([json.loads(entry) for entry in raw], channel.rank)


def describe(layout: Layout) -> str:
    """The hosts in words, for the log: ``2 hosts (2+2 ranks)``."""
    counts = "+".join(str(len(host)) for host in layout.hosts)
    return f"{len(layout.hosts)} host{'s' * (len(layout.hosts) > 1)} ({counts} ranks)"


__all__ = ["Layout", "about_me", "describe", "exchange_about", "open_host_board", "plan"]
