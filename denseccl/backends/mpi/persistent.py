"""Repeated MPI calls: the in-place start of one geometry, on persistent requests the ranks pair.

Why: a repeated synchronous in-place call (a training loop's allreduce of one buffer) is where
per-call cost shows, and MPI 4's persistent collectives (``MPI_Allreduce_init`` and friends)
let the library build its schedule once per buffer instead of once per call. Setting one up is
collective and a request matches only its own kind on the peers, while each rank's cache of
them is its own (addresses differ, eviction is local). So the ranks decide in the agreement
step they take anyway, by a tag riding in it (docs/design.md, "Persistent requests"): each call
passes the tag of the request it holds for its (geometry, address), 0 for none, and the general
path ``board.UNPLANNED``. Equal tags: every rank starts its request (all 0: all set one up now).
Mixed tags: every rank runs the nonblocking collective and drops its request. Tags number the
set-ups, the same on every rank; so persistent requests only where the check is on (or there
are no peers). The core sees none of this: it gets a ``base.Start`` (:func:`in_place`).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Dict, Optional, Tuple

from mpi4py import MPI

from ... import config
from ...transport import Start, abandon
from ...channel.base import MIXED_TAGS, SAME, ControlChannel

#: a request held for one (geometry, address): (tag, request, its Start, its Test)
Entry = Tuple[int, Any, Callable[[], Any], Callable[[], bool]]


class Requests:
    """One communicator's persistent requests, by (geometry, address): the geometry is what
    the library call binds (collective, count, dtype, op, root), numbered (:meth:`number`).
    Between calls every request here is inactive."""

    __slots__ = ("entries", "tags", "kinds")

    def __init__(self) -> None:
        self.entries: Dict[Tuple[int, int], Entry] = {}
        #: the last tag handed out
        self.tags = 0
        #: geometry -> a small int standing for it in the keys
        self.kinds: Dict[Any, int] = {}

    def number(self, geometry: Any) -> int:
        """The int that stands for ``geometry`` in this communicator's keys."""
        return self.kinds.setdefault(geometry, len(self.kinds) + 1)

    def create(self, key: Tuple[int, int], setup: Callable[[int], Any]) -> Entry:
        """Set up the request for ``key`` (collective: every rank at the same call); past
        :data:`config.PERSISTENT_REQUESTS` the oldest one goes."""
        self.tags += 1
        if len(self.entries) >= config.PERSISTENT_REQUESTS:
            self.entries.pop(next(iter(self.entries)))[1].Free()
        request = setup(key[1])
        entry = self.entries[key] = (self.tags, request, request.Start, request.Test)
        return entry

    def drop(self, key: Tuple[int, int]) -> None:
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


def in_place(
    issue: Callable[[list], Any], init: Optional[Callable[[list], Any]], count: int, mpi_type: Any,
    requests: Requests, solo: bool, geometry: Any,
) -> Start:
    """The in-place start of one geometry: ``issue(message)`` starts it as a nonblocking
    collective; ``init(message)``, where the library has persistent collectives, sets it up as
    a persistent request instead, held in ``requests`` under ``(geometry, address)``. ``solo``:
    no peers, so no step either: every call may use its request. Closures over locals: this
    runs on every repeated call."""
    nbytes = count * mpi_type.Get_size()
    fromaddress = MPI.buffer.fromaddress
    last = [0, [fromaddress(0, 0), 0, mpi_type]]

    def message(address: int) -> list:
        """The message at ``address``, reusing the last one's: a loop over one array builds it once."""
        if address != last[0]:
            last[0], last[1] = address, [fromaddress(address, nbytes), count, mpi_type]
        return last[1]  # type: ignore[return-value]

    entries, create, drop = requests.entries, requests.create, requests.drop
    kind = requests.number(geometry)  # an int: keys are hashed on every call
    #: what the last step decided: the address at which every rank starts its request (0: none),
    #: and the entry this rank holds for it (None: set it up now)
    ready: list = [0, None]

    def setup(address: int) -> Any:
        return init(message(address))  # type: ignore[misc]

    def step(control: ControlChannel, value: int, invalid: bool, deadline: Optional[float], address: int) -> int:
        """The agreement step with this rank's tag for ``address``; decides what ``start``
        starts there."""
        entry = entries.get((kind, address))
        answer = control.all_equal(value, invalid, deadline, 0 if entry is None else entry[0])  # type: ignore[call-arg]
        if answer == SAME:
            ready[0], ready[1] = address, entry
        else:
            ready[0] = 0
            if answer == MIXED_TAGS:
                drop((kind, address))
        return answer

    def start(address: int) -> Callable[[], bool]:
        """Start the call at ``address``: on its persistent request where the step just said
        so there (or there are no peers), else as a nonblocking collective."""
        decided, ready[0] = ready[0], 0
        if decided == address:
            entry = ready[1]
        elif solo and init is not None:
            entry = entries.get((kind, address))
        else:
            return issue(message(address)).Test  # type: ignore[no-any-return]
        if entry is None:
            entry = create((kind, address), setup)
        entry[2]()  # Start
        return entry[3]  # type: ignore[no-any-return]

    def lost(address: int) -> None:
        """The request started at ``address`` was abandoned with its transfer: never start or
        free it again."""
        entries.pop((kind, address), None)

    return Start(start, step if init is not None else None, lost)


__all__ = ["Requests", "in_place"]
