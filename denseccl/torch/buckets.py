"""Layout-preserving flat buckets: many tensors in one flat buffer per (device, dtype), each
tensor occupying a run of the buffer that holds its storage span in its own memory order.

``torch._utils._flatten_dense_tensors`` flattens each tensor in *logical* (row-major) order, so
a channels-last weight is transposed on the way in and comes back out row-major. Here a dense
tensor's span is copied as it lies in memory, and the bucket hands back views with the original
strides (:meth:`Bucket.view`), so nothing is transposed and unpacking is a plain copy of runs.
A tensor with gaps is packed in the closest dense layout of its own dim order.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple

import torch

from ._tensors import dense_strides_like


class Slot(NamedTuple):
    """Where one tensor lives in a bucket."""

    index: int  # type: ignore[assignment]  # position in the list given to pack() (shadows tuple.index)
    offset: int  # element offset of its span in the flat buffer
    shape: Tuple[int, ...]
    strides: Tuple[int, ...]

    @property
    def numel(self) -> int:
        return prod(self.shape)


@dataclass(eq=False)
class Bucket:
    """A flat 1-D buffer and the slots of the tensors packed into it."""

    flat: torch.Tensor
    slots: List[Slot]

    @property
    def dtype(self) -> torch.dtype:
        return self.flat.dtype

    def view(self, slot: Slot) -> torch.Tensor:
        """The tensor of ``slot``: a view into the buffer with the packed tensor's strides."""
        return self.flat.as_strided(slot.shape, slot.strides, self.flat.storage_offset() + slot.offset)

    def like(self, flat: torch.Tensor) -> "Bucket":
        """The same slots over another flat buffer (e.g. a copy of this one on another device)."""
        if flat.dim() != 1 or flat.numel() != self.flat.numel() or flat.dtype != self.flat.dtype:
            raise ValueError(
                f"a bucket of {self.flat.numel()} {self.flat.dtype} elements "
                f"cannot view {tuple(flat.shape)} {flat.dtype}"
            )
        return Bucket(flat, self.slots)


def plan(
    tensors: Sequence[torch.Tensor], *, bucket_elements: Optional[int] = None
) -> List[Tuple[Tuple[torch.device, torch.dtype], List[Slot]]]:
    """Group tensors by (device, dtype), in order, and give each a run of its group's buffer.
    With ``bucket_elements``, a group is split into buckets of about that many elements."""
    order: List[Tuple[Tuple[torch.device, torch.dtype], List[Slot]]] = []
    current: Dict[Tuple[torch.device, torch.dtype], List[Slot]] = {}  # each group's open bucket
    filled: Dict[Tuple[torch.device, torch.dtype], int] = {}  # and its elements so far
    for index, t in enumerate(tensors):
        key = (t.device, t.dtype)
        if key not in current or (bucket_elements is not None and filled[key] >= bucket_elements):
            current[key], filled[key] = [], 0
            order.append((key, current[key]))
        slot = Slot(index, filled[key], tuple(t.shape), dense_strides_like(t))
        current[key].append(slot)
        filled[key] += slot.numel
    return order


def pack(
    tensors: Sequence[torch.Tensor],
    *,
    like: Optional[Sequence[torch.Tensor]] = None,
    bucket_elements: Optional[int] = None,
    device: Optional[torch.device] = None,
) -> List[Bucket]:
    """Copy ``tensors`` into flat buckets (one per device and dtype, or of about
    ``bucket_elements`` each). Each slot has the layout of ``like[i]`` (default: of
    ``tensors[i]`` itself), so a tensor that already has it is copied as one run. ``device``
    places the buckets on another device."""
    templates = tensors if like is None else like
    if len(templates) != len(tensors):
        raise ValueError(f"pack: {len(tensors)} tensors but {len(templates)} layouts")
    buckets = []
    for (source_device, dtype), slots in plan(templates, bucket_elements=bucket_elements):
        numel = sum(slot.numel for slot in slots)
        flat = torch.empty(numel, dtype=dtype, device=device or source_device)
        bucket = Bucket(flat, slots)
        for slot in slots:
            bucket.view(slot).copy_(tensors[slot.index])
        buckets.append(bucket)
    return buckets


def unpack(buckets: Iterable[Bucket], into: Sequence[torch.Tensor]) -> None:
    """Copy every slot back into its tensor ``into[slot.index]`` (same layout: a copy of runs)."""
    for bucket in buckets:
        for slot in bucket.slots:
            into[slot.index].copy_(bucket.view(slot))


def unpacked(buckets: Iterable[Bucket], count: int) -> List[torch.Tensor]:
    """The slots' views as a list indexed like the packed tensors (``count`` of them)."""
    out: List[Optional[torch.Tensor]] = [None] * count
    for bucket in buckets:
        for slot in bucket.slots:
            out[slot.index] = bucket.view(slot)
    return out  # type: ignore[return-value]
