"""What every transport and control channel offers.

A transport maps ``(pointer, count, dtype, op, root, stream)`` to one library call and knows
nothing about layouts: pointers are the starts of storage spans, counts are element counts
(per rank for allgather and reduce-scatter). ``send == recv`` means in place.
"""

from __future__ import annotations

import ctypes
import os
import sys
from abc import ABC, abstractmethod
from typing import Any, Callable, List, Mapping, NoReturn, Optional, Protocol, Sequence, Tuple

from ..dtypes import DType
from ..errors import DenseCCLError
from ..ops import Op
from ..wait import wait_until


class Pending(ABC):
    """A started operation."""

    #: True where :meth:`wait` sleeps inside the library until completion (gloo's
    #: ``Work.wait``): a waiter then blocks there instead of polling :meth:`test`, leaving the
    #: cores to the library's own threads, which move the data
    blocks = False

    @abstractmethod
    def test(self) -> bool:
        """True once the operation has completed (never blocks)."""

    def wait(self, deadline: Optional[float]) -> None:
        """Block until completion; :class:`CollectiveTimeoutError` past ``deadline``
        (a ``time.monotonic()`` value; ``None`` waits forever). By default: poll :meth:`test`."""
        wait_until(self.test, deadline, "the collective")

    def synchronize(self, deadline: Optional[float]) -> None:
        """Block the host until the operation has completed. For host transports this is
        :meth:`wait`; device transports, whose ``wait`` only orders the caller's current
        stream after the operation, block the host here."""
        self.wait(deadline)


class Done(Pending):
    """An operation that had nothing to move."""

    def test(self) -> bool:
        return True

    def wait(self, deadline: Optional[float]) -> None:
        return None


DONE = Done()


#: requests given up on (a timeout, a broken communicator, a shutdown) with the memory they may
#: still touch: MPI cannot cancel them, and freeing an active request is erroneous
_ABANDONED: List[Any] = []
# mpi4py finalizes MPI (which still progresses these requests) in a Py_AtExit hook, after the
# interpreter has cleared every module: a reference of our own that nothing ever releases keeps
# the list, and all it holds, alive until the process ends
ctypes.pythonapi.Py_IncRef(ctypes.py_object(_ABANDONED))


def abandon(*things: Any, _kept: List[Any] = _ABANDONED) -> None:
    """Keep ``things`` (requests, buffers) alive for the rest of the process: past the
    interpreter's teardown too (``_kept`` is bound here, so this works while modules are
    being cleared)."""
    _kept.append(things)


def split_members(entries: Sequence[Sequence[int]], color: int) -> List[int]:
    """The ranks whose entry ``(color, key)`` (indexed by rank) has ``color``, ordered by
    ``(key, rank)``: the ranks of a split's new group, in the order MPI and NCCL give them."""
    return [r for _, r in sorted((k, r) for r, (c, k) in enumerate(entries) if c == color)]


def is_timeout(error: BaseException) -> bool:
    """Whether a library's error (gloo's, a store's) says that it timed out."""
    text = str(error).lower()
    return isinstance(error, TimeoutError) or "timed out" in text or "timeout" in text


class Transport(ABC):
    """Collectives on storage spans. Every method starts the operation and returns a
    :class:`Pending`; ``stream`` is meaningful only to device transports."""

    name: str
    rank: int
    size: int
    #: dtype name -> the library's own type handle, for every dtype this transport can move.
    dtypes: Mapping[str, Any]
    #: True when the transport moves device (CUDA) memory, False for host memory.
    device_memory: bool
    #: The CUDA device a device transport is bound to (None for host transports).
    device: Optional[int] = None

    @abstractmethod
    def allreduce(self, send: int, recv: int, count: int, dtype: DType, op: Op, stream: Any = None) -> Pending: ...

    @abstractmethod
    def reduce(self, send: int, recv: int, count: int, dtype: DType, op: Op, root: int, stream: Any = None) -> Pending:
        """``recv`` matters on ``root`` only."""

    @abstractmethod
    def broadcast(self, buffer: int, count: int, dtype: DType, root: int, stream: Any = None) -> Pending: ...

    @abstractmethod
    def allgather(self, send: int, recv: int, count: int, dtype: DType, stream: Any = None) -> Pending:
        """``count`` elements per rank; in place when ``send`` is block ``rank`` of ``recv``."""

    @abstractmethod
    def reduce_scatter(self, send: int, recv: int, count: int, dtype: DType, op: Op, stream: Any = None) -> Pending:
        """``count`` elements per rank: ``send`` holds ``size * count``."""

    @abstractmethod
    def barrier(self) -> Pending: ...

    def allreduce_now(self, send: int, recv: int, count: int, dtype: DType, op: Op, stream: Any = None) -> Pending:
        """``allreduce`` for a caller that waits for the returned :class:`Pending` at once, before
        any other call on this transport. A transport may then run it as several library calls,
        each issued inside that wait once the one before has completed (program order)."""
        return self.allreduce(send, recv, count, dtype, op, stream)

    def in_place(
        self, collective: str, count: int, dtype: DType, op: Optional[Op] = None, root: int = 0
    ) -> Optional[Callable[[int], Callable[[], bool]]]:
        """For repeated calls (plans.py): a callable ``address -> test`` that starts the in-place
        ``collective`` ("allreduce", "reduce" or "broadcast") on the ``count`` elements at
        ``address``, exactly as the method of that name does with ``send == recv == address``,
        and returns a non-blocking ``test()`` that is True once it has completed (Pending.test);
        None where such calls should take the full path each time. Transports may bind
        everything that does not depend on the address once."""
        if collective == "allreduce":
            return lambda a: self.allreduce(a, a, count, dtype, op).test  # type: ignore[arg-type]
        if collective == "reduce":
            return lambda a: self.reduce(a, a, count, dtype, op, root).test  # type: ignore[arg-type]
        if collective == "broadcast":
            return lambda a: self.broadcast(a, count, dtype, root).test
        raise ValueError(f"no in-place form of {collective!r}")

    def persistent(
        self, collective: str, count: int, dtype: DType, op: Optional[Op] = None, root: int = 0
    ) -> Optional[Callable[[int], Any]]:
        """For repeated calls whose ranks agree on it (plans.py): a callable ``address ->
        request`` that sets up the call :meth:`in_place` starts as a persistent request (an
        object with ``Start()``, ``Test()`` and ``Free()``, as mpi4py's ``Prequest``). Setting
        one up is collective: every rank must do it at the same point of its sequence of calls.
        None (the default) where the library has no such requests."""
        return None

    def check_op(self, op: Op, dtype: DType) -> None:
        """Raise :class:`LayoutError` if this transport cannot apply ``op`` to ``dtype``
        (restrictions beyond the common tables in ops.py, e.g. of the library's version)."""

    def failure(self) -> Optional[str]:
        """Why the transport became unusable on its own (a watchdog saw a timeout or an
        asynchronous error), or None."""
        return None

    def split(self, color: Optional[int], key: int) -> Optional["Transport"]:
        """A transport over the ranks that pass the same ``color`` (ordered by ``key``, then
        rank); None where ``color`` is None. Collective over all ranks."""
        raise DenseCCLError(f"the {self.name} transport cannot split into sub-groups")

    def close(self) -> None:
        """Release the library's communicator (collective where the library says so)."""

    def retire(self) -> None:
        """Close while a transfer started here may still be running (a Work in flight or
        abandoned): release only what that transfer cannot touch. By default :meth:`close`; a
        library that may not free a communicator under a running operation keeps it."""
        self.close()


#: answers of the agreement step (ControlChannel.all_equal): falsy only when the ranks disagree
DIFFERENT, SAME, MIXED_TAGS = 0, 1, 2
#: the agreement step's tag of a call that is not a replay of a plan (plans.Requests)
UNPLANNED = -1


def answer(agreed: bool, same_tags: bool) -> int:
    """The agreement step's answer from its two facts (see :meth:`ControlChannel.all_equal`)."""
    if not agreed:
        return DIFFERENT
    return SAME if same_tags else MIXED_TAGS


#: the agreement step: ``(value, invalid, deadline, tag) -> DIFFERENT | SAME | MIXED_TAGS``
AllEqual = Callable[[int, bool, Optional[float], int], int]


class Flag(Protocol):
    """``flag[0]``: nonzero once a peer gave up (see :meth:`ControlChannel.fast_path`)."""

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

    @abstractmethod
    def allreduce_max(self, values: Sequence[int], deadline: Optional[float]) -> Sequence[int]:
        """Element-wise maximum over ranks of a few signed 64-bit integers."""

    @abstractmethod
    def allgather_bytes(self, data: bytes, deadline: Optional[float]) -> Sequence[bytes]:
        """Every rank's ``data``, indexed by rank."""

    def all_equal(self, value: int, invalid: bool, deadline: Optional[float], tag: int = UNPLANNED) -> int:
        """The agreement step: :data:`SAME` on every rank when every rank passed the same
        ``value`` (a signed 64-bit integer) and ``tag`` and none passed ``invalid``;
        :data:`MIXED_TAGS` when only the tags differ; 0 (:data:`DIFFERENT`) otherwise. Every
        rank gets the same answer. The tag rides along for free: plans pass the identity of
        the persistent request each rank holds for the call (plans.py)."""
        highest, negated_lowest, any_invalid, top_tag, negated_bottom_tag = self.allreduce_max(
            [value, -value, int(invalid), tag, -tag], deadline
        )
        return answer(highest == -negated_lowest and not any_invalid, top_tag == -negated_bottom_tag)

    def split(self, color: Optional[int], key: int, deadline: Optional[float]) -> Optional["ControlChannel"]:
        """A channel over the ranks that pass the same ``color`` (ordered by ``key``, then rank);
        None where ``color`` is None. Collective over all ranks."""
        raise DenseCCLError(f"{type(self).__name__} cannot split into sub-groups")

    def give_up(self) -> None:
        """Tell the peers that this rank abandoned a call (a timeout): their current or next
        call must fail instead of pairing with it. Local, never blocks, never raises."""

    def peer_gave_up(self) -> Optional[int]:
        """The rank of a peer that gave up (:meth:`give_up`), or None. Cheap: called once per
        collective and on every poll of a long wait."""
        return None

    def fast_path(self) -> "Tuple[AllEqual, Flag]":
        """What every collective uses, bound once by the flow and its plans: ``all_equal`` as
        the callable that does the work (no delegation in between), and a flag whose ``[0]`` is
        nonzero once a peer gave up (a shared word on a board: no call at all)."""
        return self.all_equal, GaveUpFlag(self.peer_gave_up)

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
