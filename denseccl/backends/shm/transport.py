"""``ShmTransport``: the shared-memory engine of ranks that share one host, over their board's
data area, with a fallback engine for what does not fit (gloo, which hands it its calls).

What fits: :data:`~.repeated.COLLECTIVES` (prepared, in place) and :data:`~.first.COLLECTIVES`
(``once``: every collective but all-to-all) whose bytes in one slot are at most
``DENSECCL_HOST_PATH`` (0: never): the input, an allgather's per-rank block, a reduce-scatter's
whole stacked input. Reductions and broadcasts take every op the gloo engine takes but
PreMulSum (the fallback scales a temporary) on every dtype it reduces; allgathers and barriers
move any dtype, as bytes. Larger calls go to the fallback whole (no chunks yet).

The methods of :class:`Transport` (a call with no agreement step of the flow's) take a step of
their own on the board; the engine's calls fuse their data into the agreement step instead
(:meth:`ShmTransport.prepare`, :meth:`ShmTransport.once`).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple

from ...channel.board import Board
from ...dtypes import DType
from ...ops import Op, PreMulSum, reduction_kind
from ...transport import Pending, Start, Transport
from . import first, repeated
from .area import Area, span, torch_dtype

#: dtypes the engine reduces: those gloo reduces (the gloo engine refuses the rest before)
REDUCIBLE = frozenset(
    {"bool", "int8", "uint8", "int32", "int64", "float16", "bfloat16", "float32", "float64", "complex64", "complex128"}
)
_REDUCING = frozenset({"allreduce", "reduce", "reduce_scatter"})
#: the calls of :meth:`ShmTransport.once` kept (their views made once per geometry and address)
CALLS = 64


class ShmTransport(Transport):
    """Collectives of ``board``'s ranks through its data area of ``limit`` bytes per slot;
    ``fallback`` runs the calls that do not fit and those the step sends back."""

    name = "shm"
    device_memory = False

    def __init__(self, board: Board, limit: int, fallback: Transport) -> None:
        assert board.data is not None
        self.board = board
        self.rank, self.size = board.rank, board.size
        self.limit = limit
        self.fallback = fallback
        self.area = Area(board.data, board.size, limit)
        self.dtypes: Mapping[str, Any] = fallback.dtypes
        self._calls: Dict[Tuple[Any, ...], Start] = {}

    def fits(self, collective: str, count: int, dtype: Optional[DType], op: Optional[Op] = None) -> bool:
        """Whether a call of ``collective`` on ``count`` elements (per rank) of ``dtype`` with
        ``op`` moves here: its bytes in one slot at most ``limit``, a reduction this engine runs."""
        if collective == "barrier":
            return True
        if dtype is None or not count:
            return False
        if collective in _REDUCING or collective in repeated.COLLECTIVES:
            if dtype.name not in REDUCIBLE or isinstance(op, PreMulSum):
                return False
        nbytes = count * dtype.itemsize * (self.size if collective == "reduce_scatter" else 1)
        return nbytes <= self.limit

    def prepare(
        self, collective: str, count: int, dtype: DType, op: Optional[Op] = None, root: int = 0
    ) -> Optional[Start]:
        """The repeated in-place allreduce, reduce or broadcast (repeated.py) where it fits."""
        if collective not in repeated.COLLECTIVES or not self.fits(collective, count, dtype, op):
            return None
        typed, back = torch_dtype(dtype.name), self.fallback
        kind = None if op is None else reduction_kind(op, dtype)
        fallbacks: Dict[str, Callable[[int], Pending]] = {
            "allreduce": lambda address: back.allreduce(address, address, count, dtype, op),  # type: ignore[arg-type]
            "reduce": lambda address: back.reduce(address, address, count, dtype, op, root),  # type: ignore[arg-type]
            "broadcast": lambda address: back.broadcast(address, count, dtype, root),
        }
        return repeated.prepare(
            self.area, self.board.parity, self.rank, collective, count, typed, kind, root,
            lambda address: span(address, count, typed), fallbacks[collective],
        )

    def once(
        self, collective: str, send: int, recv: int, count: int, dtype: Optional[DType], op: Optional[Op] = None,
        root: int = 0,
    ) -> Optional[Start]:
        """The call of ``collective`` (first.py) with its data moved in its agreement step,
        where it fits; else None. Kept per geometry and addresses: a loop over the same tensors
        makes its views once (a view made for an address that a later tensor reuses is that
        tensor's memory: the flow has checked that it holds ``count`` elements there)."""
        if collective not in first.COLLECTIVES or not self.fits(collective, count, dtype, op):
            return None
        key = (collective, send, recv, count, dtype, op, root)
        start = self._calls.get(key)
        if start is None:
            if len(self._calls) >= CALLS:
                self._calls.clear()
            start = self._calls[key] = self._made(collective, send, recv, count, dtype, op, root)
        return start

    def _made(
        self, collective: str, send: int, recv: int, count: int, dtype: Optional[DType], op: Optional[Op], root: int
    ) -> Start:
        if collective == "barrier":
            return first.once(self.board.parity, first.nothing, first.nothing, self.fallback.barrier)
        assert dtype is not None
        back, kind = self.fallback, None if op is None else reduction_kind(op, dtype)
        if collective == "allreduce":
            fallback: Callable[[], Pending] = lambda: back.allreduce(send, recv, count, dtype, op)  # type: ignore[arg-type]  # noqa: E731
        elif collective == "reduce":
            fallback = lambda: back.reduce(send, recv, count, dtype, op, root)  # type: ignore[arg-type]  # noqa: E731
        elif collective == "broadcast":
            fallback = lambda: back.broadcast(send, count, dtype, root)  # noqa: E731
        elif collective == "allgather":
            fallback = lambda: back.allgather(send, recv, count, dtype)  # noqa: E731
        else:
            fallback = lambda: back.reduce_scatter(send, recv, count, dtype, op)  # type: ignore[arg-type]  # noqa: E731
        if collective == "allgather":  # any dtype, as its bytes
            typed, count_here = torch_dtype("uint8"), count * dtype.itemsize
        else:
            typed, count_here = torch_dtype(dtype.name), count
        give, take = first.moves(self.area, self.rank, collective, send, recv, count_here, typed, kind, root)
        return first.once(self.board.parity, give, take, fallback)

    def _own_step(self, start: Optional[Start], fallback: Callable[[], Pending]) -> Pending:
        """A call of the :class:`Transport` methods: ``start`` with a board step of its own
        (no deadline but the fallback's), or ``fallback()`` where it does not fit."""
        if start is None:
            return fallback()
        assert start.step is not None
        start.step(self.board, 0, False, None, 0)  # type: ignore[arg-type]  # the board takes a channel's step
        return start.start(0)  # type: ignore[return-value]

    def allreduce(self, send: int, recv: int, count: int, dtype: DType, op: Op, stream: Any = None) -> Pending:
        return self._own_step(
            self.once("allreduce", send, recv, count, dtype, op),
            lambda: self.fallback.allreduce(send, recv, count, dtype, op),
        )

    def reduce(self, send: int, recv: int, count: int, dtype: DType, op: Op, root: int, stream: Any = None) -> Pending:
        return self._own_step(
            self.once("reduce", send, recv, count, dtype, op, root),
            lambda: self.fallback.reduce(send, recv, count, dtype, op, root),
        )

    def broadcast(self, buffer: int, count: int, dtype: DType, root: int, stream: Any = None) -> Pending:
        return self._own_step(
            self.once("broadcast", buffer, buffer, count, dtype, None, root),
            lambda: self.fallback.broadcast(buffer, count, dtype, root),
        )

    def allgather(self, send: int, recv: int, count: int, dtype: DType, stream: Any = None) -> Pending:
        return self._own_step(
            self.once("allgather", send, recv, count, dtype), lambda: self.fallback.allgather(send, recv, count, dtype)
        )

    def reduce_scatter(self, send: int, recv: int, count: int, dtype: DType, op: Op, stream: Any = None) -> Pending:
        return self._own_step(
            self.once("reduce_scatter", send, recv, count, dtype, op),
            lambda: self.fallback.reduce_scatter(send, recv, count, dtype, op),
        )

    def barrier(self) -> Pending:
        return self._own_step(self.once("barrier", 0, 0, 0, None), self.fallback.barrier)

    # all-to-all and point-to-point bytes: the fallback's (no shared-memory form yet)
    def alltoallv(self, send: int, recv: int, sends: Sequence[int], receives: Sequence[int]) -> Pending:
        return self.fallback.alltoallv(send, recv, sends, receives)

    def send(self, pointer: int, nbytes: int, peer: int, tag: int) -> Pending:
        return self.fallback.send(pointer, nbytes, peer, tag)

    def recv(self, pointer: int, nbytes: int, peer: int, tag: int) -> Pending:
        return self.fallback.recv(pointer, nbytes, peer, tag)

    def check_op(self, op: Op, dtype: DType) -> None:
        self.fallback.check_op(op, dtype)

    def close(self) -> None:
        """Forget the area (the board is the control channel's: it closes it)."""
        self.fallback = None  # type: ignore[assignment]
        self._calls.clear()


__all__ = ["REDUCIBLE", "ShmTransport"]
