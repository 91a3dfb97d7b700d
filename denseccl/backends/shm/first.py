"""Every collective but all-to-all through the data area, its data moved within the call's own
agreement step (``Transport.once``): first calls, out-of-place and async ones (the repeated
in-place allreduce, reduce and broadcast are repeated.py's).

Before the step each rank copies what its peers need into its own slot of the step's parity:
its input (allreduce, reduce, allgather; the root's, broadcast), a reduce-scatter's whole
stacked input (a barrier: nothing). The step, which posts :data:`~.repeated.TAG`, is then the
barrier after which every slot holds its rank's data; each rank takes what is its own: every
slot reduced in rank order into its output (allreduce; reduce on the root), the root's slot
(broadcast), every slot in one copy into its stacked output (allgather), or its block of every
slot reduced in rank order (reduce-scatter).
So a call costs one board step, as its agreement alone did, plus two copies of its bytes.
Where the step answers anything but ``SAME`` (a peer on the fallback, a mismatch), nothing is
read: the fallback engine runs the call, or the agreement raises.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Tuple

from ...channel.base import SAME, ControlChannel
from ...ops import ReduceOp
from ...transport import DONE, Pending, Start
from .area import Area, reducer, span
from .repeated import TAG

import torch

#: the calls that move with their agreement step
COLLECTIVES = frozenset({"barrier", "allgather", "reduce_scatter", "allreduce", "reduce", "broadcast"})

#: what a rank does before the step (``give(parity)``) and after it (``take(parity)``)
Move = Callable[[int], None]


def nothing(parity: int) -> None:
    """A barrier moves no data: its step is the whole call."""


def moves(
    area: Area, rank: int, collective: str, send: int, recv: int, count: int, dtype: Any, kind: Optional[ReduceOp],
    root: int = 0,
) -> Tuple[Move, Move]:
    """``(give, take)`` of ``collective`` on the spans at ``send`` and ``recv``, ``count``
    elements of torch ``dtype`` per rank (its bytes fit the slot: the transport's ``fits``)."""
    if collective == "barrier":
        return nothing, nothing
    nbytes = count * dtype.itemsize
    size = area.size
    if collective in ("allreduce", "reduce", "broadcast"):
        return _elementwise(area, rank, collective, send, recv, count, dtype, kind, root)
    if collective == "allgather":
        mine, rows = area.mine(rank, nbytes), area.rows(nbytes)
        source = span(send, nbytes, torch.uint8)
        output = span(recv, size * nbytes, torch.uint8).view(size, nbytes)
        return lambda parity: mine[parity].copy_(source), lambda parity: output.copy_(rows[parity])  # type: ignore[misc, return-value]
    assert collective == "reduce_scatter" and kind is not None
    whole, blocks = area.mine(rank, size * nbytes), area.slots(count, dtype, rank * nbytes)
    stacked = span(send, size * nbytes, torch.uint8)
    target = span(recv, count, dtype)
    reduce = reducer(kind, size)
    return lambda parity: whole[parity].copy_(stacked), lambda parity: reduce(target, blocks[parity])  # type: ignore[misc, return-value]


def _elementwise(
    area: Area, rank: int, collective: str, send: int, recv: int, count: int, dtype: Any, kind: Optional[ReduceOp],
    root: int,
) -> Tuple[Move, Move]:
    """``(give, take)`` of an allreduce, reduce or broadcast (``send``: a broadcast's buffer)."""
    slots = area.slots(count, dtype)
    source = span(send, count, dtype)
    gives = collective != "broadcast" or rank == root
    give = (lambda parity: slots[parity][rank].copy_(source)) if gives else nothing
    if collective == "broadcast":
        take = nothing if rank == root else (lambda parity: source.copy_(slots[parity][root]))
    elif collective == "reduce" and rank != root:
        take = nothing  # a non-root's input is only read
    else:
        assert kind is not None
        target, reduce = span(recv, count, dtype), reducer(kind, area.size)
        take = lambda parity: reduce(target, slots[parity])  # noqa: E731
    return give, take  # type: ignore[return-value]


def once(parity_of: Callable[[], int], give: Move, take: Move, fallback: Callable[[], Pending]) -> Start:
    """The call as a :class:`Start` whose ``step`` gives and takes the agreement step and whose
    ``start`` takes from the slots (returning a completed :class:`Pending`), or starts
    ``fallback()`` where the step said not every rank is here (or was never taken: the check off)."""
    #: whether the last step said SAME, and its parity
    ready = [False, 0]

    def step(control: ControlChannel, value: int, invalid: bool, deadline: Optional[float], address: int) -> int:
        parity = parity_of()
        if not invalid:
            give(parity)
        answer = control.all_equal(value, invalid, deadline, TAG)  # type: ignore[call-arg]
        ready[0], ready[1] = answer == SAME, parity
        return answer

    def start(address: int) -> Pending:
        decided, ready[0] = ready[0], False
        if not decided:
            return fallback()
        take(ready[1])  # type: ignore[arg-type]
        return DONE

    return Start(start, step)  # type: ignore[arg-type]


__all__ = ["COLLECTIVES", "moves", "once"]
