"""The transport interface the core calls and every backend implements: a transport and its
pending operations (the control channel's interface is denseccl/channel/base.py).

A transport maps ``(pointer, count, dtype, op, root, stream)`` to one library call and knows
nothing about layouts: pointers are the starts of storage spans, counts are element counts
(per rank for allgather and reduce-scatter). ``send == recv`` means in place. So the core
(validation, the agreement, the flow, the waits) is written once, and a backend is only its
library's calls. :meth:`Transport.prepare` binds a repeated in-place call once (a
:class:`Start`); a backend whose repeated calls the ranks must decide together (MPI's
persistent requests) does so in :attr:`Start.step`, the agreement step it is handed.
:func:`abandon` keeps whatever a transfer that cannot be cancelled may still touch.
"""

from __future__ import annotations

import ctypes
from abc import ABC, abstractmethod
from typing import Any, Callable, List, Mapping, Optional, Sequence

from .channel.base import ControlChannel
from .dtypes import DType
from .errors import DenseCCLError
from .ops import Op
from .wait import wait_until


class Pending(ABC):
    """A started operation."""

    #: True where :meth:`wait` sleeps inside the library (gloo's ``Work.wait``): a waiter blocks
    #: there instead of polling :meth:`test`, leaving the cores to the library's threads
    blocks = False

    #: True where the transport fails the operation itself at its timeout (a device transport's
    #: watchdog aborts the communicator; :meth:`test` then reports it ended and :meth:`wait`
    #: raises). A poller sets no deadline of its own on such an operation: its ``wait`` orders
    #: device streams instead of timing out, which is refused while a CUDA graph capture runs
    watched = False

    #: what a wait's errors call the operation
    what = "the collective"

    @abstractmethod
    def test(self) -> bool:
        """True once the operation has completed (never blocks)."""

    def wait(self, deadline: Optional[float]) -> None:
        """Block until completion (by default: poll :meth:`test`); :class:`CollectiveTimeoutError`
        past ``deadline``, a ``time.monotonic()`` value (None: never)."""
        wait_until(self.test, deadline, self.what)

    def synchronize(self, deadline: Optional[float]) -> None:
        """Block the host until the operation has completed: :meth:`wait`, except on device
        transports, whose ``wait`` only orders the caller's current stream after it."""
        self.wait(deadline)

    def source(self) -> int:
        """A receive's (:meth:`Transport.recv`) sender, once it completed."""
        raise NotImplementedError("only a receive has a source")


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
    """Keep ``things`` (requests, buffers) alive for the rest of the process, past the
    interpreter's teardown too (``_kept`` is bound here: it works while modules are cleared)."""
    _kept.append(things)


def split_members(entries: Sequence[Sequence[int]], color: int) -> List[int]:
    """The ranks whose entry ``(color, key)`` (indexed by rank) has ``color``, ordered by
    ``(key, rank)``: the ranks of a split's new group, in the order MPI and NCCL give them."""
    return [r for _, r in sorted((k, r) for r, (c, k) in enumerate(entries) if c == color)]


def is_timeout(error: BaseException) -> bool:
    """Whether a library's error (gloo's, a store's) says that it timed out."""
    text = str(error).lower()
    return isinstance(error, TimeoutError) or "timed out" in text or "timeout" in text


#: an agreement step of a transport's own (:attr:`Start.step`):
#: ``(control, value, invalid, deadline, address) -> agreed``
Step = Callable[["ControlChannel", int, bool, Optional[float], int], Any]


class Start:
    """A transport's in-place call of one geometry with all but the address bound
    (:meth:`Transport.prepare`). ``start(address)`` starts it on the span at ``address`` and
    returns its test. ``step``, where not None, is the agreement step to take instead of the
    channel's ``all_equal`` (MPI pairs its persistent requests there). ``lost(address)``: the
    transfer at ``address`` was abandoned (a timeout): nothing it holds may be started again."""

    __slots__ = ("start", "step", "lost")

    def __init__(
        self, start: Callable[[int], Callable[[], bool]], step: Optional[Step] = None,
        lost: Callable[[int], None] = lambda address: None,
    ) -> None:
        self.start = start
        self.step = step
        self.lost = lost


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

    # -- bytes between ranks (the torch adapter's all-to-all, send and recv; host transports) --

    def alltoallv(self, send: int, recv: int, sends: Sequence[int], receives: Sequence[int]) -> Pending:
        """``sends[r]`` bytes go to rank ``r`` and ``receives[r]`` bytes come from it, each
        rank's run after the one before it, at ``send`` and at ``recv``."""
        raise DenseCCLError(f"the {self.name} transport has no all-to-all")

    def send(self, pointer: int, nbytes: int, peer: int, tag: int) -> Pending:
        """``nbytes`` at ``pointer`` to rank ``peer``; messages of one sender and tag arrive in order."""
        raise DenseCCLError(f"the {self.name} transport has no point-to-point")

    def recv(self, pointer: int, nbytes: int, peer: int, tag: int) -> Pending:
        """At most ``nbytes`` from rank ``peer`` (< 0: any rank; :meth:`Pending.source` says which)."""
        raise DenseCCLError(f"the {self.name} transport has no point-to-point")

    def allreduce_now(self, send: int, recv: int, count: int, dtype: DType, op: Op, stream: Any = None) -> Pending:
        """``allreduce`` for a caller that waits for it at once, before any other call on this
        transport: it may run as several library calls, each issued inside that wait."""
        return self.allreduce(send, recv, count, dtype, op, stream)

    def prepare(
        self, collective: str, count: int, dtype: DType, op: Optional[Op] = None, root: int = 0
    ) -> Optional["Start"]:
        """The in-place, synchronous ``collective`` ("allreduce", "reduce" or "broadcast") on
        ``count`` elements, bound once for every call of that geometry: a :class:`Start`, or
        None where such calls run the general method each time. By default that method in place."""
        if collective == "allreduce":
            return Start(lambda a: self.allreduce_now(a, a, count, dtype, op).test)  # type: ignore[arg-type]
        if collective == "reduce":
            return Start(lambda a: self.reduce(a, a, count, dtype, op, root).test)  # type: ignore[arg-type]
        if collective == "broadcast":
            return Start(lambda a: self.broadcast(a, count, dtype, root).test)
        raise ValueError(f"no in-place form of {collective!r}")

    def once(
        self, collective: str, send: int, recv: int, count: int, dtype: Optional[DType], op: Optional[Op] = None,
        root: int = 0,
    ) -> Optional["Start"]:
        """The call of ``collective`` (any but all-to-all; a barrier has no spans and no dtype)
        on the spans at ``send`` and ``recv`` whose data moves within its agreement step: a
        :class:`Start` whose ``step`` replaces the channel's ``all_equal`` and whose ``start``
        then returns a :class:`Pending` (not a test: the call may be async). None (the
        default): the general method, after the channel's step. A transport whose ranks share
        memory (backends/shm) fuses the copy of its data into the step that must come first."""
        return None

    def check_op(self, op: Op, dtype: DType) -> None:
        """Raise :class:`ArgumentError` or :class:`OpError` if this transport cannot apply ``op`` to ``dtype``
        (restrictions beyond the common tables in ops.py, e.g. of the library's version)."""

    def hear(self, control: ControlChannel) -> None:
        """Let this transport's own waits (those inside the library, or on a device) learn from
        ``control`` that a peer gave up, and end then instead of at the timeout. By default
        nothing: the flow's waits hear it themselves."""

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
        abandoned): release only what that transfer cannot touch (by default :meth:`close`)."""
        self.close()
