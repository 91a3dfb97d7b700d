"""A repeated small in-place allreduce, reduce or broadcast through the data area
(``Transport.prepare``, which ``Flow.replay`` runs on every repeated call).

Each rank copies its span into its own slot before it posts the agreement step, and once the
step returns every rank's slot holds its data. Each rank then reduces all slots, in rank order,
into its span (a broadcast copies the root's slot): the same operations on the same values in
the same order, so every rank gets the same bits. A call is on this path only where every rank
knows so in the step: prepared calls post :data:`TAG`; a rank on the general path posts
``UNPLANNED``, the step answers ``MIXED_TAGS``, and every rank runs the call through the
fallback (gloo). With the agreement step off there is no step, so no shared memory: the fallback.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional

import torch

from ...channel.base import SAME, ControlChannel
from ...ops import ReduceOp
from ...transport import Pending, Start
from .area import Area, reducer

#: the tag a call through shared memory posts in its agreement step (the general path posts UNPLANNED)
TAG = 1
#: the calls prepared: the in-place ones Flow.replay repeats
COLLECTIVES = frozenset({"allreduce", "reduce", "broadcast"})


def prepare(
    area: Area, parity_of: Callable[[], int], rank: int, collective: str, count: int, dtype: Any,
    kind: Optional[ReduceOp], root: int, view: Callable[[int], torch.Tensor], fallback: Callable[[int], Pending],
) -> Start:
    """The repeated in-place ``collective`` of ``count`` elements of torch ``dtype`` (``kind``:
    its reduction): ``view(address)`` is the span at ``address``, ``fallback(address)`` the same
    call through the fallback engine. Closures over locals: this runs on every repeated call."""
    size = area.size
    slots = area.slots(count, dtype)
    #: whether this rank's span goes into its slot; what it does with the slots after the step
    gives = collective != "broadcast" or rank == root
    finish = _finisher(collective, rank, size, root, kind)
    #: the span of the last address (a loop over one tensor makes it once)
    last: list = [0, None]
    #: what the last step decided: the address the call runs at here (0: the fallback), its parity
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
        """Finish the call from the slots where the step said so; else through the fallback."""
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
    return reducer(kind, size)


def _done() -> bool:
    return True


def _settled(pending: Pending) -> bool:
    """The call a prepared call fell back to, waited for (the fallback's own limit applies)."""
    pending.wait(None)
    return True


__all__ = ["COLLECTIVES", "TAG", "prepare"]
