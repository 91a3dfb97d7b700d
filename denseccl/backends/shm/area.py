"""The data area of a board: per step parity and rank, one slot of whole cache lines
(``DENSECCL_HOST_PATH`` bytes), and the reductions every rank runs over the slots in rank order.

The layout: slot ``(parity, rank)`` starts at byte ``(parity * size + rank) * slot_bytes(limit)``.
A rank writes only its own slot of the parity of the step its call takes (``Board.parity``);
every peer reads it after that step and before its own next step, and the rank rewrites it
two steps later, when every peer has arrived at the step in between (board.py).
"""

from __future__ import annotations

import ctypes
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from ...ops import ReduceOp

#: slots start on cache lines of their own
ALIGN = 64
#: the views of the slots kept per geometry (a loop over a few sizes makes each once)
VIEWS = 64

#: how each reduction combines two operands into ``out`` (avg: summed, then divided)
COMBINE: Dict[ReduceOp, Callable[..., Any]] = {
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


def reducer(kind: ReduceOp, size: int) -> Callable[[torch.Tensor, List[torch.Tensor]], None]:
    """``reduce(target, rows)``: the ``size`` rows combined in rank order into ``target``
    (avg: then divided). The same operations in the same order on every rank: the same bits."""
    combine, divide = COMBINE[kind], kind is ReduceOp.AVG

    def reduce(target: torch.Tensor, rows: List[torch.Tensor]) -> None:
        if size == 1:
            target.copy_(rows[0])
        else:
            combine(rows[0], rows[1], out=target)
        for peer in range(2, size):
            combine(target, rows[peer], out=target)
        if divide:
            average(target, size)

    return reduce


def span(address: int, count: int, dtype: Any) -> torch.Tensor:
    """The ``count`` elements of torch ``dtype`` at ``address`` as a 1-D tensor over that
    memory (no copy)."""
    nbytes = count * dtype.itemsize
    return torch.frombuffer((ctypes.c_byte * nbytes).from_address(address), dtype=dtype, count=count)


class Area:
    """The slots of a board's data area ``data`` for ``size`` ranks, ``limit`` bytes each."""

    def __init__(self, data: memoryview, size: int, limit: int) -> None:
        self.size, self.limit = size, limit
        self.slot = slot_bytes(limit)
        self._data = data
        #: the whole area as bytes, shaped (parity, rank, byte of the slot)
        self.grid = torch.frombuffer(data, dtype=torch.uint8).view(2, size, self.slot)
        self._views: Dict[Tuple[Any, ...], Any] = {}

    def _kept(self, key: Tuple[Any, ...], make: Callable[[], Any]) -> Any:
        views = self._views.get(key)
        if views is None:
            if len(self._views) >= VIEWS:
                self._views.clear()
            views = self._views[key] = make()
        return views

    def slots(self, count: int, dtype: Any, offset: int = 0) -> List[List[torch.Tensor]]:
        """Per parity, per rank: ``count`` elements of torch ``dtype`` from byte ``offset`` of
        that rank's slot (they fit: ``offset + count * itemsize <= limit``). Kept per geometry."""

        def make() -> List[List[torch.Tensor]]:
            return [
                [
                    torch.frombuffer(
                        self._data, dtype=dtype, count=count, offset=(parity * self.size + rank) * self.slot + offset
                    )
                    for rank in range(self.size)
                ]
                for parity in (0, 1)
            ]

        return self._kept(("slots", count, dtype, offset), make)  # type: ignore[no-any-return]

    def rows(self, nbytes: int) -> List[torch.Tensor]:
        """Per parity: the first ``nbytes`` of every rank's slot, shaped (rank, byte): one copy
        takes them all (an allgather's output, stacked). Kept per size."""
        return self._kept(("rows", nbytes), lambda: [self.grid[parity, :, :nbytes] for parity in (0, 1)])  # type: ignore[no-any-return]

    def mine(self, rank: int, nbytes: int) -> List[torch.Tensor]:
        """Per parity: the first ``nbytes`` of ``rank``'s slot as bytes."""
        return self._kept(("mine", rank, nbytes), lambda: [self.grid[parity, rank, :nbytes] for parity in (0, 1)])  # type: ignore[no-any-return]


def torch_dtype(name: str) -> Optional[Any]:
    """The torch dtype of a denseccl dtype name, or None."""
    return getattr(torch, name, None)


__all__ = ["ALIGN", "COMBINE", "Area", "area_bytes", "average", "reducer", "slot_bytes", "span", "torch_dtype"]
