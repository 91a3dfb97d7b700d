"""Layout helpers on torch tensors, built on the pure rules of :mod:`denseccl.layout`.

A dense tensor's elements fill one block of ``numel`` consecutive elements (its span) in some
permuted order; these helpers read that order, allocate tensors that keep it, and view the
dim-0 concatenated buffers of ``all_gather_into_tensor`` / ``reduce_scatter_tensor`` as the
stacked buffers denseccl moves, and key the layouts of blocks and of tensor lists.
"""

from __future__ import annotations

from typing import Sequence, Tuple

import torch

from ..errors import LayoutError
from ..layout import (
    Layout,
    contiguous_strides,
    is_non_overlapping_and_dense,
    layout_key,
    physical_order,
    stacked_problem,
)
from ..layout import overlap as ranges_overlap


def is_dense(t: torch.Tensor) -> bool:
    """Non-overlapping and dense by denseccl's rule (size-1 dims ignored, empty is dense)."""
    return is_non_overlapping_and_dense(tuple(t.shape), t.stride())


def key_of(t: torch.Tensor) -> tuple:
    """The layout key: dtype name, shape, and strides with size-1 dims wildcarded."""
    return layout_key(str(t.dtype).rpartition(".")[2], tuple(t.shape), t.stride())


def composite_key(tensors: Sequence[torch.Tensor]) -> tuple:
    """One layout key standing for several tensors (dtypes, shapes and strides of each)."""
    keys = [key_of(t) for t in tensors]
    return ("+".join(k[0] for k in keys), tuple(k[1] for k in keys), tuple(k[2] for k in keys))


def dense_strides_like(t: torch.Tensor) -> Tuple[int, ...]:
    """``t``'s own strides when ``t`` is dense, else the dense strides in its physical dim order
    (``x[::2]`` -> row-major, a gapped channels-last view -> channels-last)."""
    if is_dense(t):
        return t.stride()
    return contiguous_strides(tuple(t.shape), physical_order(tuple(t.shape), t.stride()))


def restrided(x: torch.Tensor, strides: Sequence[int]) -> torch.Tensor:
    """``x`` itself when it already has the dense ``strides`` (size-1 dims excepted), else a
    copy of ``x`` with them. Differentiable, so it also serves gradients built with
    ``create_graph=True``."""
    shape = tuple(x.shape)
    strides = tuple(strides)
    if layout_key("", shape, x.stride()) == layout_key("", shape, strides):
        return x
    return torch.empty_strided(shape, strides, dtype=x.dtype, device=x.device).copy_(x)


def overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two dense tensors' spans share memory (torch strides are never negative, so a
    span starts at the tensor's storage offset)."""
    if a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return False
    return ranges_overlap(*_span_bytes(a), *_span_bytes(b))


def _span_bytes(t: torch.Tensor) -> Tuple[int, int]:
    """Where a dense tensor's span starts in its storage, and its length, in bytes."""
    return t.storage_offset() * t.element_size(), t.numel() * t.element_size()


def stacked_view(buffer: torch.Tensor, block_shape: Sequence[int], size: int, what: str) -> torch.Tensor:
    """``buffer`` (a dim-0 concatenated ``(size * d0, *rest)`` or stacked ``(size, *block)``
    tensor) viewed as ``(size, *block_shape)``. Splitting dim 0 is always a view."""
    block_shape = tuple(block_shape)
    shape = tuple(buffer.shape)
    stacked_shape = (size, *block_shape)
    concatenated = (size * block_shape[0], *block_shape[1:]) if block_shape else (size,)
    if shape not in (stacked_shape, concatenated):
        raise LayoutError(
            f"{what} has shape {shape}, but for {size} ranks of blocks of shape {block_shape} it must have "
            f"shape {concatenated} (blocks concatenated along dim 0) or {stacked_shape} (stacked)"
        )
    return buffer.view(stacked_shape)


def is_stacked(view: torch.Tensor, size: int) -> bool:
    """Whether a ``(size, *block)`` view is a stacked buffer denseccl can move directly: dense,
    blocks one after another in memory (dim 0 outermost)."""
    layout = Layout(tuple(view.shape), view.stride(), view.element_size(), "t")
    return layout.is_dense and stacked_problem(layout, size) is None


def stack_like(block: torch.Tensor, size: int) -> torch.Tensor:
    """An empty stacked buffer ``(size, *block.shape)`` whose blocks have ``block``'s dense
    layout."""
    strides = dense_strides_like(block)
    return torch.empty_strided((size, *block.shape), (block.numel(), *strides), dtype=block.dtype, device=block.device)


def staging_stack(view: torch.Tensor, size: int) -> torch.Tensor:
    """An empty stacked buffer for a ``(size, *block)`` view whose dim 0 is not outermost: the
    blocks are laid out in the view's block dim order (a function of the input's layout only,
    so ranks with equal layouts stage equally)."""
    return stack_like(view[0], size)


def not_dense_message(name: str, t: torch.Tensor) -> str:
    return (
        f"{name} (shape {tuple(t.shape)}, strides {t.stride()}) is not non-overlapping and dense: it has gaps "
        "or repeats elements. Pass a dense tensor (t.contiguous(), or t.clone(memory_format=...)) and copy "
        "the result back if you need it there"
    )


def land(out: torch.Tensor, received: torch.Tensor) -> None:
    """Write a staged result into the caller's ``out`` as a library writes raw memory: with
    autograd not watching, so that a leaf that requires grad (a pipeline stage's receive buffer)
    takes it, as gloo and NCCL fill such a tensor in place."""
    out.detach().copy_(received)
