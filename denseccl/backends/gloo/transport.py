"""The gloo transport and control channel: torch's gloo moves host spans.

Each method views the span at ``pointer`` as a 1-D tensor (no copy) and makes one gloo call on
it. What gloo lacks is supplied around the call, as the MPI transport does: ``avg`` as a sum
then a division, ``PreMulSum`` as a scaling first, an out-of-place allreduce as a copy into
``recv`` (gloo reduces in place), a reduce on a non-root rank through a temporary (gloo uses the
input as scratch there, and denseccl promises to only read it), dtypes gloo cannot move (int16,
the unsigned ints above 8 bits, fp8) as bytes. Reductions of those dtypes are refused.

The agreement step runs on the shared-memory board of each host (denseccl/channel/shared.py),
and where there is none on a second gloo group of the same ranks (:class:`GlooControl`), so
that it never queues behind a large transfer. Both groups are made from one key-value store; a
peer that never joins makes their creation raise :class:`CollectiveTimeoutError` in time.
"""

from __future__ import annotations

import ctypes
import time
from datetime import timedelta
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, TypeVar

import torch
import torch._C._distributed_c10d as c10d
from torch.distributed import PrefixStore, ProcessGroupGloo

from ... import config, log
from ...channel.shared import SharedControl, open_shared
from ...dtypes import DTYPES, DType
from ...errors import ArgumentError, DenseCCLError, OpError, peer_gave_up_error, timeout_error
from ...ops import Op, PreMulSum, ReduceOp, op_kind, reduction_kind
from ...channel.base import ControlChannel, StoreNews
from ...transport import Pending, Start, Transport, is_timeout, split_members
from ..shm.area import area_bytes, average
from ..shm.transport import ShmTransport
from .held import Held

#: every dtype denseccl knows, as torch's; those gloo cannot carry move as bytes
_TORCH: Dict[str, Any] = {
    name: getattr(torch, name)
    for name in (
        "bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float16", "bfloat16",
        "float32", "float64", "complex64", "complex128", "float8_e4m3fn", "float8_e5m2",
    )
    if hasattr(torch, name)
}
#: dtypes gloo reduces (and moves as themselves)
_GLOO_TYPES = frozenset(
    {"bool", "int8", "uint8", "int32", "int64", "float16", "bfloat16", "float32", "float64", "complex64", "complex128"}
)
_RED = c10d.ReduceOp
_GLOO_OPS = {
    ReduceOp.SUM: _RED.SUM,
    ReduceOp.AVG: _RED.SUM,
    ReduceOp.PREMUL_SUM: _RED.SUM,
    ReduceOp.PRODUCT: _RED.PRODUCT,
    ReduceOp.MIN: _RED.MIN,
    ReduceOp.MAX: _RED.MAX,
}
#: gloo's own limit on one call when the communicator waits forever
_FOREVER = timedelta(days=365)


def span_tensor(pointer: int, count: int, dtype: DType) -> torch.Tensor:
    """The ``count`` elements at ``pointer`` as a 1-D tensor over that memory (no copy); dtypes
    gloo cannot carry are viewed as their bytes."""
    nbytes = count * dtype.itemsize
    raw = (ctypes.c_byte * nbytes).from_address(pointer)
    if dtype.name in _GLOO_TYPES:
        return torch.frombuffer(raw, dtype=_TORCH[dtype.name], count=count)
    return torch.frombuffer(raw, dtype=torch.uint8, count=nbytes)


def _factor(op: PreMulSum, dtype: DType) -> Any:
    """A PreMulSum factor in the dtype's kind (ops.py has checked that an integer one is whole)."""
    return int(op.factor) if dtype.kind in "iu" else op.factor


def wait_work(work: Any, deadline: Optional[float], what: str, watch: Optional[Callable[[], None]] = None) -> None:
    """Block on a gloo Work until ``deadline`` (a ``time.monotonic()`` value; None: gloo's own
    limit), turning gloo's timeout into :class:`CollectiveTimeoutError`. ``watch``: called every
    :data:`config.WATCH_SECONDS` of the wait, raises if it is hopeless (a peer gave up)."""
    while True:
        now = time.monotonic()
        end = None if watch is None else now + config.WATCH_SECONDS
        last = end is None or (deadline is not None and deadline <= end)
        until = deadline if last else end
        try:
            if until is None:
                work.wait()
            else:
                work.wait(timedelta(seconds=max(until - now, 0.001)))
            return
        except RuntimeError as error:
            # a slice of the wait ended while the call still runs: hear the news, wait on
            if not is_timeout(error) or last or work.is_completed():
                if is_timeout(error):
                    raise timeout_error(what, "gloo: " + str(error).splitlines()[0][:200]) from None
                raise
        watch()  # type: ignore[misc]  # not last: there is a watch


class GlooPending(Pending):
    """A gloo Work, plus what must run on the host once it has completed."""

    __slots__ = ("work", "finish", "keep", "held", "polled", "watch")
    blocks = True  # gloo's threads move the data; a polling waiter would take their cores
    what = "gloo collective"

    def __init__(
        self,
        work: Any,
        held: Held,
        keep: Tuple[torch.Tensor, ...] = (),
        finish: Optional[Callable[[], None]] = None,
        polled: bool = True,
    ) -> None:
        self.work = work
        self.finish = finish
        #: the temporaries and views gloo reads and writes, handed to ``held`` once complete
        self.keep = keep
        self.held = held
        #: False for gloo works that never report completion until waited for (reduce_scatter):
        #: test() then waits, bounded by the group's timeout
        self.polled = polled
        #: raises once a peer gave up (the transport's ``watch``); only a polled work's wait hears it
        self.watch: Optional[Callable[[], None]] = None

    def test(self) -> bool:
        if self.polled and not self.work.is_completed():
            return False
        self.wait(None)
        return True

    def wait(self, deadline: Optional[float]) -> None:
        try:
            # raises the work's error, if any
            wait_work(self.work, deadline, self.what, self.watch if self.polled else None)
        finally:  # gloo's threads may not have let go of them yet, or still run (held.py)
            keep, self.keep = self.keep, ()
            if keep:
                self.held.hold(keep)
        finish, self.finish = self.finish, None
        if finish is not None:
            finish()


class GlooReceived(GlooPending):
    """A receive's work from ``peer`` (< 0: any rank, which gloo names once it completed)."""

    __slots__ = ("peer",)

    def __init__(self, work: Any, held: Held, keep: Tuple[torch.Tensor, ...], peer: int) -> None:
        super().__init__(work, held, keep)
        self.peer = peer

    def source(self) -> int:
        return self.peer if self.peer >= 0 else int(self.work._source_rank())


def _bytes(pointer: int, nbytes: int) -> torch.Tensor:
    """The ``nbytes`` at ``pointer`` as a 1-D uint8 tensor over that memory (none: a new empty one)."""
    return span_tensor(pointer, nbytes, DTYPES["uint8"]) if nbytes else torch.empty(0, dtype=torch.uint8)


def make_group(
    store: Any, prefix: str, rank: int, size: int, timeout: Optional[float], what: str, deadline: Optional[float] = None
) -> Any:
    """A gloo group of ``size`` ranks on ``store`` under ``prefix`` whose calls give up after
    ``timeout`` seconds (None: never); CollectiveTimeoutError when a peer has not joined by
    ``deadline`` (a ``time.monotonic()`` value; default: ``timeout`` from now)."""
    limit = _FOREVER if timeout is None else timedelta(seconds=timeout)
    connect = limit if deadline is None else timedelta(seconds=max(deadline - time.monotonic(), 0.001))
    try:
        group = ProcessGroupGloo(PrefixStore(prefix, store), rank, size, connect)
    except RuntimeError as error:  # DistStoreError and gloo's connect errors are RuntimeErrors
        if is_timeout(error):
            raise timeout_error(what, "gloo: " + str(error).splitlines()[0][:200]) from None
        raise DenseCCLError(f"{what} failed: {type(error).__name__}: {error}") from error
    if connect != limit:
        group._set_default_timeout(limit)
    return group


_Group = TypeVar("_Group", bound="_GlooGroup")


class _GlooGroup:
    """What the transport and the control channel have alike: a gloo group of their own, made on
    ``store`` under ``prefix`` with ``timeout``, and how it splits."""

    def __init__(self, group: Any, store: Any, prefix: str, timeout: Optional[float]) -> None:
        self.group: Any = group
        self.rank: int = group.rank()
        self.size: int = group.size()
        self._store, self._prefix, self._timeout = store, prefix, timeout
        #: the tensors of completed calls, until gloo's threads let go of them (held.py)
        self.held = Held()
        self._splits = 0  # how many splits this rank has made of the group (they name the sub-groups)

    def split(self: _Group, color: Optional[int], key: int, deadline: Optional[float] = None) -> Optional[_Group]:
        """One of the same class over the ranks passing ``color`` (None for a rank that passes
        None), ordered by ``(key, rank)`` as MPI and NCCL order them; the n-th split gets the
        same store prefix on every rank. ``deadline`` bounds the exchange of colours (the
        transport's split has none: gloo's own limit)."""
        index = self._splits
        self._splits += 1
        mine = torch.tensor([-1 if color is None else color, key], dtype=torch.int64)
        every = torch.empty(2 * self.size, dtype=torch.int64)
        wait_work(self.group._allgather_base(every, mine, c10d.AllgatherOptions()), deadline, "the gloo split")
        self.held.hold((every, mine))
        if color is None:
            return None
        members = split_members(every.view(-1, 2).tolist(), color)
        prefix = f"{self._prefix}split{index}/color{color}/"
        group = make_group(self._store, prefix, members.index(self.rank), len(members), self._timeout, "the gloo split")
        return type(self)(group, self._store, prefix, self._timeout)

    def close(self) -> None:
        self.held.drain()  # before the group's threads go: they must not release Python objects
        self.group = None


class GlooTransport(_GlooGroup, Transport):
    """Collectives on host spans over a torch gloo group (which this transport owns)."""

    name = "gloo"
    device_memory = False
    dtypes = _TORCH

    #: the non-root reduce's copy, kept for the next call: a new one per call would have all
    #: its pages faulted in again each time (a copy of a large tensor is mapped afresh). At most
    #: one is kept; a call holds it alone (list.pop is atomic: two threads never take the same)
    _spares: List[torch.Tensor]

    def __init__(self, group: Any, store: Any, prefix: str, timeout: Optional[float]) -> None:
        super().__init__(group, store, prefix, timeout)
        self._spares = []
        #: the shared-memory engine (backends/shm) this one hands its small calls to, where the
        #: ranks share one host; None elsewhere
        self.host: Optional[ShmTransport] = None
        #: raises once a peer gave up (:meth:`hear`)
        self.watch: Optional[Callable[[], None]] = None

    def hear(self, control: ControlChannel) -> None:
        flag = control.gave_up_flag()

        def watch() -> None:
            if flag[0]:
                raise peer_gave_up_error(control.peer_gave_up())

        self.watch = watch

    def _pending(
        self, work: Any, keep: Tuple[torch.Tensor, ...] = (), finish: Optional[Callable[[], None]] = None,
        polled: bool = True,
    ) -> GlooPending:
        pending = GlooPending(work, self.held, keep, finish, polled)
        pending.watch = self.watch
        return pending

    def _take_spare(self, nbytes: int) -> torch.Tensor:
        try:
            spare = self._spares.pop()
        except IndexError:  # none kept, or another call holds it
            return torch.empty(nbytes, dtype=torch.uint8)
        return spare if spare.numel() >= nbytes else torch.empty(nbytes, dtype=torch.uint8)

    def _return_spare(self, spare: torch.Tensor) -> None:
        if not self._spares:
            self._spares.append(spare)

    def _op(self, op: Op, dtype: DType) -> Any:
        return _GLOO_OPS[reduction_kind(op, dtype)]

    def check_op(self, op: Op, dtype: DType) -> None:
        if dtype.name not in _GLOO_TYPES:
            raise ArgumentError(
                f"the gloo engine cannot reduce {dtype.name} (gloo reduces {', '.join(sorted(_GLOO_TYPES))}); "
                "convert to one of those, or launch with mpiexec for denseccl's MPI transport"
            )
        if dtype.kind == "c" and op_kind(op) is ReduceOp.PRODUCT:
            raise OpError(
                "the gloo engine cannot take the product of complex numbers; launch with mpiexec for the MPI transport"
            )

    def _finish(self, op: Op, target: torch.Tensor) -> Optional[Callable[[], None]]:
        if op_kind(op) is not ReduceOp.AVG:
            return None
        size = self.size
        return lambda: average(target, size)

    def _prepared(self, send: int, recv: int, count: int, dtype: DType, op: Op) -> torch.Tensor:
        """``recv`` holding what gloo reduces in place: ``send`` (copied when it is elsewhere),
        scaled first for PreMulSum."""
        target = span_tensor(recv, count, dtype)
        if isinstance(op, PreMulSum):
            torch.mul(span_tensor(send, count, dtype), _factor(op, dtype), out=target)
        elif send != recv:
            target.copy_(span_tensor(send, count, dtype))
        return target

    def allreduce(self, send: int, recv: int, count: int, dtype: DType, op: Op, stream: Any = None) -> Pending:
        target = self._prepared(send, recv, count, dtype, op)
        options = c10d.AllreduceOptions()
        options.reduceOp = self._op(op, dtype)
        return self._pending(self.group.allreduce([target], options), (target,), self._finish(op, target))

    def reduce(self, send: int, recv: int, count: int, dtype: DType, op: Op, root: int, stream: Any = None) -> Pending:
        if self.rank == root:
            target = self._prepared(send, recv, count, dtype, op)
            finish = self._finish(op, target)
        else:  # gloo writes partial results into a non-root rank's tensor: give it a copy
            source = span_tensor(send, count, dtype)
            spare = self._take_spare(count * dtype.itemsize)
            target = spare[: count * dtype.itemsize].view(_TORCH[dtype.name])
            if isinstance(op, PreMulSum):
                torch.mul(source, _factor(op, dtype), out=target)
            else:
                target.copy_(source)
            finish = lambda: self._return_spare(spare)  # noqa: E731
        options = c10d.ReduceOptions()
        options.reduceOp = self._op(op, dtype)
        options.rootRank = root
        return self._pending(self.group.reduce([target], options), (target,), finish)

    def broadcast(self, buffer: int, count: int, dtype: DType, root: int, stream: Any = None) -> Pending:
        target = span_tensor(buffer, count, dtype)
        options = c10d.BroadcastOptions()
        options.rootRank = root
        return self._pending(self.group.broadcast([target], options), (target,))

    def allgather(self, send: int, recv: int, count: int, dtype: DType, stream: Any = None) -> Pending:
        output = span_tensor(recv, count * self.size, dtype)
        source = span_tensor(send, count, dtype)  # in place: this is output's own block
        work = self.group._allgather_base(output, source, c10d.AllgatherOptions())
        return self._pending(work, (output, source))

    def reduce_scatter(self, send: int, recv: int, count: int, dtype: DType, op: Op, stream: Any = None) -> Pending:
        source = span_tensor(send, count * self.size, dtype)
        if isinstance(op, PreMulSum):
            source = source * _factor(op, dtype)  # the input is only read: scale a temporary
        target = span_tensor(recv, count, dtype)
        options = c10d.ReduceScatterOptions()
        options.reduceOp = self._op(op, dtype)
        work = self.group._reduce_scatter_base(target, source, options)
        return self._pending(work, (source, target), self._finish(op, target), polled=False)

    def barrier(self) -> Pending:
        return self._pending(self.group.barrier(c10d.BarrierOptions()))

    def alltoallv(self, send: int, recv: int, sends: Sequence[int], receives: Sequence[int]) -> Pending:
        source, target = _bytes(send, sum(sends)), _bytes(recv, sum(receives))
        work = self.group.alltoall_base(target, source, list(receives), list(sends), c10d.AllToAllOptions())
        return self._pending(work, (source, target))

    # a send's or recv's work reports completion only once waited for, and a wait whose own
    # timeout runs out cancels the transfer: their waits are not sliced to hear a peer (no watch)
    def send(self, pointer: int, nbytes: int, peer: int, tag: int) -> Pending:
        source = _bytes(pointer, nbytes)
        return GlooPending(self.group.send([source], peer, tag), self.held, (source,))

    def recv(self, pointer: int, nbytes: int, peer: int, tag: int) -> Pending:
        target = _bytes(pointer, nbytes)
        work = self.group.recv_anysource([target], tag) if peer < 0 else self.group.recv([target], peer, tag)
        return GlooReceived(work, self.held, (target,), peer)

    def prepare(
        self, collective: str, count: int, dtype: DType, op: Optional[Op] = None, root: int = 0
    ) -> Optional[Start]:
        """A small repeated allreduce, reduce or broadcast of ranks on one host: the shared-memory
        engine's (backends/shm/repeated.py). Anything else runs the general path each time
        (gloo's wait blocks in the library: GlooPending.blocks)."""
        host = self.host
        return None if host is None else host.prepare(collective, count, dtype, op, root)

    def once(
        self, collective: str, send: int, recv: int, count: int, dtype: Optional[DType], op: Optional[Op] = None,
        root: int = 0,
    ) -> Optional[Start]:
        """A small call of ranks on one host, its data moved in its agreement step: the
        shared-memory engine's (backends/shm/first.py), which falls back to this one."""
        host = self.host
        return None if host is None else host.once(collective, send, recv, count, dtype, op, root)

    def close(self) -> None:
        self._spares.clear()
        if self.host is not None:
            self.host.close()
        self.host = None
        super().close()


class GlooControl(_GlooGroup, ControlChannel):
    """The agreement step over a gloo group of its own."""

    def __init__(self, group: Any, store: Any, prefix: str, timeout: Optional[float]) -> None:
        super().__init__(group, store, prefix, timeout)
        self._max = c10d.AllreduceOptions()
        self._max.reduceOp = _RED.MAX  # type: ignore[assignment]  # torch takes the RedOpType
        #: gloo carries no notes: the "gave up" news is a key on the store
        self._news = StoreNews(store, f"{prefix}gave_up", self.size)

    def give_up(self) -> None:
        self._news.tell(self.rank)

    def peer_gave_up(self) -> Optional[int]:
        return self._news.heard()

    def _watch(self) -> None:
        rank = self._news.heard()
        if rank is not None:
            raise peer_gave_up_error(rank)

    def path(self) -> str:
        return f"a gloo allreduce per call on the control group ({self.size} ranks)"

    def allreduce_max(self, values: Sequence[int], deadline: Optional[float]) -> Sequence[int]:
        buffer = torch.tensor(list(values), dtype=torch.int64)
        wait_work(self.group.allreduce([buffer], self._max), deadline, "the agreement step", self._watch)
        self.held.hold((buffer,))
        return buffer.tolist()

    def allgather_bytes(self, data: bytes, deadline: Optional[float]) -> Sequence[bytes]:
        lengths = torch.empty(self.size, dtype=torch.int64)
        mine = torch.tensor([len(data)], dtype=torch.int64)
        wait_work(self.group._allgather_base(lengths, mine, c10d.AllgatherOptions()), deadline, "the agreement step",
                  self._watch)
        self.held.hold((lengths, mine))
        longest = max(int(lengths.max()), 1)
        padded = torch.zeros(longest, dtype=torch.uint8)
        padded[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else padded[:0]
        gathered = torch.empty(longest * self.size, dtype=torch.uint8)
        wait_work(self.group._allgather_base(gathered, padded, c10d.AllgatherOptions()), deadline, "the agreement step",
                  self._watch)
        self.held.hold((gathered, padded))
        raw = gathered.numpy().tobytes()
        return [raw[r * longest : r * longest + int(n)] for r, n in enumerate(lengths.tolist())]


def open_gloo(
    store: Any, rank: int, size: int, timeout: Optional[float], prefix: str, deadline: Optional[float]
) -> Tuple[GlooTransport, ControlChannel]:
    """The transport and control channel of ``size`` ranks meeting on ``store``: two gloo groups
    (data, agreement) under ``prefix``; the agreement step on the hosts' shared-memory boards
    where they can be made (denseccl/channel/shared.py), on the second group otherwise.
    CollectiveTimeoutError when a peer has not joined by ``deadline`` (a ``time.monotonic()``
    value; None: never)."""
    if not 0 <= rank < size:
        raise DenseCCLError(f"rank {rank} is not in 0..{size - 1}")
    data = make_group(store, f"{prefix}data/", rank, size, timeout, "the gloo engine's bootstrap", deadline)
    control = make_group(store, f"{prefix}control/", rank, size, timeout, "the gloo engine's bootstrap", deadline)
    transport = GlooTransport(data, store, f"{prefix}data/", timeout)
    # gloo's threads move the data: agreement waits leave them the cores (open_shared's sleepy)
    channel = open_shared(
        GlooControl(control, store, f"{prefix}control/", timeout), deadline, sleepy=True,
        data_bytes=lambda limit: area_bytes(limit, size),
    )
    board = channel.host_data() if isinstance(channel, SharedControl) else None
    if board is not None:
        limit = channel.layout.host_path  # type: ignore[attr-defined]  # the smallest of every rank's
        transport.host = ShmTransport(board, limit, transport)
        log.info("gloo engine: calls of up to %d bytes through this host's shared memory (backends/shm, "
                 "DENSECCL_HOST_PATH)", limit)
    return transport, channel


__all__ = ["GlooControl", "GlooPending", "GlooTransport", "make_group", "open_gloo", "span_tensor", "wait_work"]
