"""Repeated MPI calls: the in-place start of one geometry, on persistent requests the ranks pair.

Why this exists: a repeated synchronous in-place call (a training loop's allreduce of the same
buffer) is where per-call cost shows, and MPI 4's persistent collectives (``MPI_Allreduce_init``
and friends) let the library build its schedule once per buffer instead of once per call. But
setting one up is collective, a persistent request matches only its own kind on the peers,
and each rank's cache of them is its own (addresses differ, eviction is local). So the ranks
decide together, in the agreement step they take anyway, by a tag riding in it (the MPI
channels carry one: control.py, board.py): a call passes the tag of the request it holds
for its (geometry, address), 0 where it holds none. Equal tags: every rank starts the request it
holds, or, where none holds one (0), all set one up now. Different tags (one rank evicted
its request, another rank's call is on the general path, which passes ``board.UNPLANNED``):
every rank runs the nonblocking collective, and a rank that held a request drops it, so that
the next call sets up a new one on every rank. Tags number the set-ups, the same on every
rank. Hence persistent requests only where the check is on (or there are no peers).

The core sees none of this: :meth:`MPITransport.prepare` hands it a ``base.Start`` whose
``step`` is :meth:`InPlace.step` (the agreement with the tag) and whose ``start`` starts what
the step decided. Everything else (which library call, its message) is bound once here.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Dict, Optional, Tuple

from mpi4py import MPI

from ... import config
from ..base import ControlChannel, abandon
from .board import MIXED_TAGS, SAME

#: a request held for one (digest, address): (tag, request, its Start, its Test)
Entry = Tuple[int, Any, Callable[[], Any], Callable[[], bool]]


class Requests:
    """One communicator's persistent requests, by (geometry, address): the geometry is what
    the library call binds (collective, count, dtype, op, root). Between calls every request
    here is inactive."""

    __slots__ = ("entries", "tags")

    def __init__(self) -> None:
        self.entries: Dict[Tuple[Any, int], Entry] = {}
        #: the last tag handed out
        self.tags = 0

    def create(self, key: Tuple[Any, int], setup: Callable[[int], Any]) -> Entry:
        """Set up the request for ``key`` (collective: every rank at the same call); past
        :data:`config.PERSISTENT_REQUESTS` the oldest one goes."""
        self.tags += 1
        if len(self.entries) >= config.PERSISTENT_REQUESTS:
            self.entries.pop(next(iter(self.entries)))[1].Free()
        request = setup(key[1])
        entry = self.entries[key] = (self.tags, request, request.Start, request.Test)
        return entry

    def drop(self, key: Tuple[Any, int]) -> None:
        """Free the request held for ``key``, if any (inactive)."""
        entry = self.entries.pop(key, None)
        if entry is not None:
            entry[1].Free()

    def release(self, keep: bool) -> None:
        """Free every request (all inactive), or with ``keep`` hand them to ``abandon`` (a
        transfer may not have completed: nothing of the communicator is freed)."""
        requests = [entry[1] for entry in self.entries.values()]
        self.entries.clear()
        if keep:
            abandon(requests)
            return
        for request in requests:
            with contextlib.suppress(Exception):  # MPI already finalized: nothing left to free
                request.Free()


class InPlace:
    """The in-place start of one geometry: ``issue(address)`` starts it as a nonblocking
    collective; ``setup(address)``, where the library has persistent collectives, sets it up
    as a persistent request instead, held in ``requests`` under ``(geometry, address)``.
    ``solo``: no peers, so no step either: every call may use its request."""

    __slots__ = ("issue", "setup", "requests", "solo", "geometry", "_ready")

    def __init__(
        self, issue: Callable[[int], Callable[[], bool]], setup: Optional[Callable[[int], Any]], requests: Requests,
        solo: bool, geometry: Any,
    ) -> None:
        self.issue = issue
        self.setup = setup
        self.requests = requests
        self.solo = solo
        self.geometry = geometry
        #: the address at which the last step decided that every rank starts its request
        self._ready: Optional[int] = None

    def step(self, control: ControlChannel, value: int, invalid: bool, deadline: Optional[float], address: int) -> int:
        """The agreement step with this rank's tag for ``address``; decides what :meth:`start`
        starts there."""
        key = (self.geometry, address)
        entry = self.requests.entries.get(key)
        answer = control.all_equal(value, invalid, deadline, 0 if entry is None else entry[0])  # type: ignore[call-arg]
        if answer == SAME:
            self._ready = address
        else:
            self._ready = None
            if answer == MIXED_TAGS:
                self.requests.drop(key)
        return answer

    def start(self, address: int) -> Callable[[], bool]:
        """Start the call at ``address``: on its persistent request where the step just said
        so there (or there are no peers), else as a nonblocking collective."""
        ready, self._ready = self._ready, None
        if self.setup is None or (ready != address and not self.solo):
            return self.issue(address)
        key = (self.geometry, address)
        entry = self.requests.entries.get(key)
        if entry is None:
            entry = self.requests.create(key, self.setup)
        entry[2]()  # Start
        return entry[3]

    def lost(self, address: int) -> None:
        """The request started at ``address`` was abandoned with its transfer: never start or
        free it again."""
        self.requests.entries.pop((self.geometry, address), None)


def message_at(count: int, mpi_type: Any) -> Callable[[int], list]:
    """``address -> message`` for ``count`` elements of ``mpi_type``, reusing the message of
    the last address: a loop over one array builds it once."""
    nbytes = count * mpi_type.Get_size()
    fromaddress = MPI.buffer.fromaddress
    last = [0, [fromaddress(0, 0), 0, mpi_type]]

    def message(address: int) -> list:
        if address != last[0]:
            last[0], last[1] = address, [fromaddress(address, nbytes), count, mpi_type]
        return last[1]  # type: ignore[return-value]

    return message


__all__ = ["InPlace", "Requests", "message_at"]
