"""The host path: a repeated small allreduce, reduce or broadcast of ranks that share one host,
through the board's shared memory instead of gloo.

Why: gloo has no shared-memory transport; a 4 KiB allreduce of two ranks on one host is a TCP
round through gloo's worker and loop threads, about 0.45 ms here and 4 ms whenever the scheduler
parks one of those threads for a slice. MPI libraries move such calls through shared memory
(MPICH's and Open MPI's shared-memory transports). The agreement board is that memory already,
and its step is the barrier such a path needs: each rank copies its span into its own slot
before it posts the step, and once the step returns every rank's slot holds its data. Each rank
then reduces all slots, in rank order, into its span (a broadcast copies the root's slot): the
same operations on the same values in the same order, so every rank gets the same bits. Nothing
but torch's elementwise kernels and the board: no protocol of its own beyond the slot layout.

The slots are double-buffered by the step's parity (``Board.parity``): a rank rewrites a half two
steps later, when every peer has arrived at the step in between and so has finished reducing this
one (the reduce runs right after the step, before the caller's next call; prepared calls are
synchronous). A call is on this path only where every rank knows so in the step: prepared calls
(``Flow.replay``'s repeated in-place calls) post :data:`TAG` in the step; a rank on the general
path posts ``UNPLANNED``, the step answers ``MIXED_TAGS``, and every rank runs the call through
gloo. With the agreement step off there is no step, so no host path: gloo.

What it covers: :data:`COLLECTIVES` of at most ``DENSECCL_HOST_PATH`` bytes (0: never) with any
op the communicator caches (sum, prod, min, max, avg; a PreMulSum is validated on every call, so
never prepared) and any dtype the gloo engine reduces, on a communicator whose ranks all share
one host (splits: gloo).
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional

import torch

from ...channel.base import SAME, ControlChannel
from ...channel.board import Board
from ...dtypes import DType
from ...ops import Op, ReduceOp, reduction_kind
from ...transport import Pending, Start

#: the tag a call on the host path posts in its agreement step (the general path posts UNPLANNED)
TAG = 1
#: the calls the host path makes: the in-place calls that are prepared (Flow.replay)
COLLECTIVES = frozenset({"allreduce", "reduce", "broadcast"})
#: slots start on cache lines of their own
ALIGN = 64

#: how each reduction combines two operands into ``out`` (avg: summed, then divided)
_COMBINE = {
    ReduceOp.SUM: torch.add,
    ReduceOp.AVG: torch.add,
    ReduceOp.PRODUCT: torch.mul,
    ReduceOp.MIN: torch.minimum,
    ReduceOp.MAX: torch.maximum,
}


def slot_bytes(limit: int) -> int:
    """A slot's size for calls of up to ``limit`` bytes: whole cache lines."""
    return -(-limit // ALIGN) * ALIGN


def area_bytes(limit: int, size: int) -> int:
    """The data area of ``size`` ranks for calls of up to ``limit`` bytes: two slots per rank."""
    return 2 * size * slot_bytes(limit)


def average(target: torch.Tensor, size: int) -> None:
    """``target`` divided by ``size`` in place: truncating for integers, as gloo's avg does."""
    if target.is_floating_point() or target.is_complex():
        target.div_(size)
    else:
        torch.div(target, size, rounding_mode="trunc", out=target)


class HostPath:
    """The host path of one communicator over ``board`` (whose ``data`` holds a slot of
    ``limit`` bytes per rank and parity): :meth:`prepare` makes the repeated call."""

    def __init__(self, board: Board, limit: int) -> None:
        assert board.data is not None
        self.board = board
        self.rank, self.size = board.rank, board.size
        self.limit = limit
        self._slot = slot_bytes(limit)
        self._data = board.data

    def fits(self, collective: str, nbytes: int) -> bool:
        """Whether a call of ``collective`` on ``nbytes`` takes this path."""
        return collective in COLLECTIVES and 0 < nbytes <= self.limit

    def slots(self, count: int, dtype: Any) -> List[List[torch.Tensor]]:
        """Per parity, per rank: that rank's slot as ``count`` elements of the torch ``dtype``
        (``count`` of them fit: :meth:`fits`)."""
        return [
            [
                torch.frombuffer(self._data, dtype=dtype, count=count, offset=(parity * self.size + rank) * self._slot)
                for rank in range(self.size)
            ]
            for parity in (0, 1)
        ]

    def prepare(
        self, collective: str, count: int, dtype: DType, torch_dtype: Any, op: Optional[Op], root: int,
        view: Callable[[int], torch.Tensor], fallback: Callable[[int], Pending],
    ) -> Start:
        """The repeated in-place ``collective`` (one of :data:`COLLECTIVES`) of ``count``
        elements: ``view(address)`` is the span at ``address`` as a tensor, ``fallback(address)``
        the same call through gloo (when the step says that not every rank is on this path).
        Closures over locals: this runs on every repeated call."""
        slots = self.slots(count, torch_dtype)
        rank, size, parity_of = self.rank, self.size, self.board.parity
        #: whether this rank's span goes into its slot; what it does with the slots after the step
        gives = collective != "broadcast" or rank == root
        finish = _finisher(collective, rank, size, root, None if op is None else reduction_kind(op, dtype))
        #: the span of the last address (a loop over one tensor makes it once)
        last: list = [0, None]
        #: what the last step decided: the address the host path runs at (0: gloo), its parity
        ready = [0, 0]

        def span(address: int) -> torch.Tensor:
            if address != last[0]:
                last[0], last[1] = address, view(address)
            return last[1]  # type: ignore[no-any-return]

        def step(control: ControlChannel, value: int, invalid: bool, deadline: Optional[float], address: int) -> int:
            """Copy this rank's span into its slot, then the agreement step with :data:`TAG`."""
            parity = parity_of()
            if gives and not invalid:
                slots[parity][rank].copy_(span(address))
            answer = control.all_equal(value, invalid, deadline, TAG)  # type: ignore[call-arg]
            ready[0], ready[1] = (address if answer == SAME else 0), parity
            return answer

        def start(address: int) -> Callable[[], bool]:
            """Finish the call from the slots where the step said so; else through gloo."""
            decided, ready[0] = ready[0], 0
            if decided != address:  # never 0: a call on this path has bytes, hence an address
                pending = fallback(address)
                return lambda: _settled(pending)
            if finish is not None:
                finish(span(address), slots[ready[1]])
            return _done

        return Start(start, step)


def _finisher(
    collective: str, rank: int, size: int, root: int, kind: Optional[ReduceOp]
) -> Optional[Callable[[torch.Tensor, List[torch.Tensor]], None]]:
    """What a rank does with every rank's slot (``row``) once the step returned: reduce them in
    rank order into its span (allreduce; reduce on the root), take the root's (broadcast, on
    the others), or nothing (a non-root's reduce: its span is only read)."""
    if collective == "broadcast":
        return None if rank == root else lambda target, row: target.copy_(row[root])  # type: ignore[misc, return-value]
    if collective == "reduce" and rank != root:
        return None
    assert kind is not None
    combine, divide = _COMBINE[kind], kind is ReduceOp.AVG

    def reduce(target: torch.Tensor, row: List[torch.Tensor]) -> None:
        combine(row[0], row[1], out=target)
        for peer in range(2, size):
            combine(target, row[peer], out=target)
        if divide:
            average(target, size)

    return reduce


def _done() -> bool:
    return True


def _settled(pending: Pending) -> bool:
    """The gloo call a prepared call fell back to, waited for (gloo's own limit applies)."""
    pending.wait(None)
    return True


__all__ = ["ALIGN", "COLLECTIVES", "TAG", "HostPath", "area_bytes", "average", "slot_bytes"]
