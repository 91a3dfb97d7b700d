"""The control channel: what carries the agreement step and the "a peer gave up" news between
a communicator's ranks, and the step's answers.

A channel is a small host round among the ranks, never a device sync. The rounds themselves
are each library's (an MPI communicator, a gloo group, a key-value store: backends/); a host's
shared-memory board wraps any of them (shared.py), so that the ranks of one host agree with no
message at all.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from abc import ABC, abstractmethod
from typing import Any, Callable, NoReturn, Optional, Protocol, Sequence

from .. import config, log
from ..errors import DenseCCLError

#: answers of the agreement step (``all_equal`` with a tag): falsy only when the
#: ranks disagree; MIXED_TAGS when they agree on the call but hold different persistent
#: requests for it (backends/mpi/persistent.py)
DIFFERENT, SAME, MIXED_TAGS = 0, 1, 2
#: the tag of a call that holds no persistent request and may not set one up (the general path)
UNPLANNED = -1


class Flag(Protocol):
    """``flag[0]``: nonzero once a peer gave up (see :meth:`ControlChannel.gave_up_flag`)."""

    def __getitem__(self, index: int) -> int: ...


class GaveUpFlag:
    """A :class:`Flag` that asks a channel's ``peer_gave_up`` each time it is read."""

    __slots__ = ("_ask",)

    def __init__(self, ask: Callable[[], Optional[int]]) -> None:
        self._ask = ask

    def __getitem__(self, index: int) -> int:
        return 0 if self._ask() is None else 1


class ControlChannel(ABC):
    """A small host channel between the ranks, for agreement: never a device sync."""

    rank: int
    size: int
    #: the shared-memory board that answers the agreement step on this rank's host, or None
    board: Any = None
    #: what drives the library's progress while a board's wait lasts (MPI's Iprobe), or None
    progress: Optional[Callable[[], Any]] = None
    #: whether this rank's host's ranks share cores (judged at set-up), None where not judged
    crowded: Optional[bool] = None
    #: set up by ``channel.shared.open_shared`` (a board where one can be made): not to be again
    opened = False

    @abstractmethod
    def allreduce_max(self, values: Sequence[int], deadline: Optional[float]) -> Sequence[int]:
        """Element-wise maximum over ranks of a few signed 64-bit integers."""

    @abstractmethod
    def allgather_bytes(self, data: bytes, deadline: Optional[float]) -> Sequence[bytes]:
        """Every rank's ``data``, indexed by rank."""

    def all_equal(self, value: int, invalid: bool, deadline: Optional[float], tag: int = UNPLANNED) -> int:
        """The agreement step, the same answer on every rank: :data:`SAME` when every rank
        passed the same ``value`` (a signed 64-bit integer) and ``tag`` and none passed
        ``invalid``; :data:`MIXED_TAGS` when only the tags differ (a prepared call's, pairing
        persistent requests or the host path); else :data:`DIFFERENT` (falsy)."""
        top, negated_bottom, any_invalid, top_tag, negated_bottom_tag = self.allreduce_max(
            [value, -value, int(invalid), tag, -tag], deadline
        )
        if top != -negated_bottom or any_invalid:
            return DIFFERENT
        return SAME if top_tag == -negated_bottom_tag else MIXED_TAGS

    def split(self, color: Optional[int], key: int, deadline: Optional[float]) -> Optional["ControlChannel"]:
        """A channel over the ranks that pass the same ``color`` (ordered by ``key``, then rank);
        None where ``color`` is None. Collective over all ranks."""
        raise DenseCCLError(f"{type(self).__name__} cannot split into sub-groups")

    def path(self) -> str:
        """How this channel takes the agreement step, in words (``DENSECCL_DEBUG=INFO``, docs)."""
        return f"{type(self).__name__} ({self.size} ranks)"

    def give_up(self) -> None:
        """Tell the peers that this rank abandoned a call (a timeout): their current or next
        call must fail instead of pairing with it. Local, never blocks, never raises."""

    def peer_gave_up(self) -> Optional[int]:
        """The rank of a peer that gave up (:meth:`give_up`), or None; cheap (polled in waits)."""
        return None

    def gave_up_flag(self) -> Flag:
        """A flag whose ``[0]`` is nonzero once a peer gave up, read after every call."""
        return GaveUpFlag(self.peer_gave_up)

    def abort(self, message: str) -> NoReturn:
        """End the whole job at once (``DENSECCL_ON_TIMEOUT=abort``); this process by default."""
        print(message, file=sys.stderr, flush=True)
        os._exit(1)

    def close(self) -> None:
        """Release the channel."""

    def retire(self) -> None:
        """Close while a transfer of the communicator may still be running (see
        :meth:`Transport.retire`); by default :meth:`close`."""
        self.close()


class StoreNews:
    """The "gave up" news of a round that carries none itself (a gloo group's, a store's): a key
    on the launch's store, written by the rank that gives up, read at most every
    :data:`config.WATCH_SECONDS` (a store operation is a network round)."""

    def __init__(self, store: Any, key: str, size: int) -> None:
        self._store, self._key = store, key
        self._heard: Optional[int] = None
        #: the first read comes a while after the channel was made; a rank alone reads nothing
        self._next = time.monotonic() + config.WATCH_SECONDS if size > 1 else float("inf")

    def tell(self, rank: int) -> None:
        """Leave the news (best effort: a store that is gone cannot carry it)."""
        try:
            self._store.set(self._key, str(rank))
        except Exception as error:  # noqa: BLE001 - telling is best effort
            log.warning("could not leave the news that rank %d gave up on the store: %s", rank, error)

    def heard(self) -> Optional[int]:
        """The rank that gave up, or None (cheap between two reads of the store)."""
        if self._heard is None and time.monotonic() >= self._next:
            self._next = time.monotonic() + config.WATCH_SECONDS
            with contextlib.suppress(Exception):  # a store that is gone brings no news
                if self._store.check([self._key]):
                    self._heard = int(bytes(self._store.get(self._key)).decode())
        return self._heard


__all__ = ["DIFFERENT", "MIXED_TAGS", "SAME", "UNPLANNED", "ControlChannel", "Flag", "GaveUpFlag", "StoreNews"]
