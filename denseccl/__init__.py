"""denseccl: collectives on arrays of any non-overlapping dense memory layout.

Allreduce, reduce, broadcast, allgather and reduce-scatter run on each array's storage span
with no copies, after checking that every rank holds the same layout, shape, dtype, op and root.
"""

from __future__ import annotations

from typing import Any

from .arrays import Buffer, as_buffer
from .bootstrap import init
from .communicator import Communicator, Work
from .errors import (
    ArgumentError, CollectiveTimeoutError, CommunicatorBrokenError, DenseCCLError, LayoutError, MismatchError, OpError,
)
from .layout import Layout
from .ops import PreMulSum, ReduceOp
from .recorder import dump_all as dump_traces

__version__ = "0.1.0"


def layout_of(x: Any) -> Layout:
    """The :class:`Layout` of an array: shape, element strides, itemsize, dtype, whether it is
    dense, its span and its layout key."""
    return as_buffer(x).layout


def same_layout(a: Any, b: Any) -> bool:
    """Whether two arrays have the same layout key (dtype, shape, strides of dims > 1)."""
    return layout_of(a).key == layout_of(b).key


__all__ = [
    "ArgumentError",
    "Buffer",
    "CollectiveTimeoutError",
    "Communicator",
    "CommunicatorBrokenError",
    "DenseCCLError",
    "Layout",
    "LayoutError",
    "MismatchError",
    "OpError",
    "PreMulSum",
    "ReduceOp",
    "Work",
    "dump_traces",
    "init",
    "layout_of",
    "same_layout",
]
