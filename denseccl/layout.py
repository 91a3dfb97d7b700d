"""The pure core: which memory layouts are dense, where their storage span lies, and when two
layouts are the same. Plain integers (sizes, element strides) and the standard library only.

A layout is *non-overlapping and dense* when its elements fill exactly one block of ``numel``
consecutive elements, the **storage span**, in some permuted (and, with negative strides,
mirrored) order. Two arrays with the same layout key put the same logical element at the same
position of their spans, which is what lets a collective run on the spans directly.
"""

from __future__ import annotations

from functools import lru_cache
from math import prod
from typing import Any, Optional, Sequence, Tuple

Shape = Tuple[int, ...]
Strides = Tuple[int, ...]
#: A layout key: ``(dtype, shape, strides)`` with ``None`` for every stride that carries no
#: information (size-1 dims; all dims when the array is empty).
LayoutKey = Tuple[str, Shape, Tuple[Optional[int], ...]]


def is_non_overlapping_and_dense(shape: Sequence[int], strides: Sequence[int]) -> bool:
    """True when the elements fill one block of ``numel`` consecutive elements.

    Dims of size 1 are ignored, any size-0 dim makes the array dense (it holds nothing).
    Walking the remaining dims from the smallest ``|stride|``, each ``|stride|`` must equal
    the product of the sizes walked so far; a stride of 0 on a dim of size > 1 overlaps and
    fails this automatically.
    """
    if len(shape) != len(strides):
        raise ValueError(f"shape {tuple(shape)} and strides {tuple(strides)} differ in length")
    if any(size == 0 for size in shape):
        return True
    expected = 1
    for stride, size in sorted((abs(stride), size) for size, stride in zip(shape, strides) if size != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def span_start(shape: Sequence[int], strides: Sequence[int]) -> int:
    """Offset (in elements, <= 0) of the lowest element from the array's data pointer
    (0 for an empty array, which addresses nothing)."""
    if any(size == 0 for size in shape):
        return 0
    return sum((size - 1) * stride for size, stride in zip(shape, strides) if stride < 0 and size > 0)


def physical_order(shape: Sequence[int], strides: Sequence[int]) -> Tuple[int, ...]:
    """Dims from outermost to innermost in memory (a permutation of ``range(ndim)``).

    Ties (size-1 dims, equal strides) are broken by dim index so that every rank derives the
    same permutation from the same layout key.
    """
    return tuple(sorted(range(len(shape)), key=lambda d: (-abs(strides[d]) if shape[d] != 1 else 1, d)))


def contiguous_strides(shape: Sequence[int], order: Optional[Sequence[int]] = None) -> Strides:
    """Strides of a dense layout whose dims are laid out outermost-first in ``order``
    (row-major when ``order`` is omitted)."""
    if order is None:
        order = range(len(shape))
    strides = [0] * len(shape)
    running = 1
    for d in reversed(tuple(order)):
        strides[d] = running
        running *= max(shape[d], 1)
    return tuple(strides)


class Layout:
    """Shape, element strides, itemsize and dtype name of an array (all plain values).

    Immutable; the derived facts (dense, span, key) are computed once at construction, because
    adapters cache one Layout per geometry and every collective reads them.
    """

    __slots__ = ("shape", "strides", "itemsize", "dtype", "numel", "is_dense", "span", "key")

    def __init__(self, shape: Sequence[int], strides: Sequence[int], itemsize: int, dtype: str) -> None:
        shape, strides = tuple(shape), tuple(strides)
        numel = prod(shape)
        fields = {
            "shape": shape, "strides": strides, "itemsize": itemsize, "dtype": dtype, "numel": numel,
            "is_dense": is_non_overlapping_and_dense(shape, strides), "span": (span_start(shape, strides), numel),
            "key": layout_key(dtype, shape, strides),
        }
        for name, value in fields.items():
            object.__setattr__(self, name, value)

    shape: Shape
    strides: Strides
    itemsize: int
    dtype: str
    numel: int
    is_dense: bool
    #: ``(lo, numel)``: the span is the ``numel`` elements from ``lo`` elements past the data
    #: pointer (``lo <= 0``; it is negative only with negative strides).
    span: Tuple[int, int]
    key: "LayoutKey"

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Layout is immutable")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Layout) and self.__reduce__() == other.__reduce__()

    def __hash__(self) -> int:
        return hash(self.__reduce__())

    def __repr__(self) -> str:
        return f"Layout(shape={self.shape}, strides={self.strides}, itemsize={self.itemsize}, dtype={self.dtype!r})"

    def __reduce__(self) -> Tuple[type, Tuple[Any, ...]]:
        """How a Layout pickles: the four values that make it, which also decide equality."""
        return Layout, (self.shape, self.strides, self.itemsize, self.dtype)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize

    def describe(self) -> str:
        """``float32 shape (2, 3) strides (1, 2)``: how errors name a layout."""
        return f"{self.dtype} shape {self.shape} strides {self.strides}"


def layout_key(dtype: str, shape: Shape, strides: Strides) -> LayoutKey:
    """Canonical form of a layout: strides of size-1 dims (all dims when empty) wildcarded."""
    if any(size == 0 for size in shape):
        return dtype, shape, (None,) * len(shape)
    return dtype, shape, tuple(None if size == 1 else stride for size, stride in zip(shape, strides))


@lru_cache(maxsize=4096)
def _stacked(shape: Shape, strides: Strides, size: int) -> Tuple[Shape, Strides]:
    return (size, *shape), (prod(shape), *strides)


def stacked(block: Layout, size: int) -> Layout:
    """The stacked layout ``(size, *block.shape)`` whose block ``r`` is a span of ``block``:
    dim 0 has stride ``numel`` and the other dims keep the block's strides."""
    shape, strides = _stacked(block.shape, block.strides, size)
    return Layout(shape, strides, block.itemsize, block.dtype)


def block_of(stacked_layout: Layout) -> Layout:
    """The layout of one block ``buf[r]`` of a stacked buffer (its dims after dim 0)."""
    return Layout(stacked_layout.shape[1:], stacked_layout.strides[1:], stacked_layout.itemsize, stacked_layout.dtype)


def stacked_problem(buffer: Layout, size: int) -> Optional[str]:
    """Why ``buffer`` cannot serve as a stacked buffer for ``size`` ranks, or None if it can.

    It must be dense, have ``size`` rows along dim 0, stride ``numel of a block`` along dim 0
    (free when ``size`` is 1) and blocks that are dense themselves.
    """
    if buffer.ndim == 0:
        return "it is 0-d; a stacked buffer has a leading dim of one block per rank"
    if buffer.shape[0] != size:
        return f"its dim 0 has size {buffer.shape[0]}, not the number of ranks ({size})"
    block = block_of(buffer)
    if not block.is_dense:
        return "its blocks buf[r] are not dense"
    if size > 1 and block.numel > 0 and buffer.strides[0] != block.numel:
        return (
            f"its dim 0 has stride {buffer.strides[0]}, but consecutive blocks must follow each "
            f"other in memory (stride {block.numel}, the number of elements of a block)"
        )
    return None


def overlap(a_start: int, a_len: int, b_start: int, b_len: int) -> bool:
    """Whether two half-open ranges ``[start, start + len)`` share any address."""
    return a_len > 0 and b_len > 0 and a_start < b_start + b_len and b_start < a_start + a_len
