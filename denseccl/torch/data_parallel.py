"""``denseccl.torch.DataParallel``: ``nn.DataParallel`` whose replicas keep the parameters'
memory layouts.

``nn.DataParallel`` replicates with ``comm.broadcast_coalesced``, which flattens every tensor in
logical order and unflattens row-major: a channels-last conv weight becomes a row-major replica
(its convolutions then pick other kernels or transpose), and its gradient, reduced by
``reduce_add_coalesced`` in the same way, arrives row-major and is copied once more by
``AccumulateGrad`` to obey the parameter's layout.

Here both directions go through the layout-preserving buckets of :mod:`.buckets`: a replica is
a view with the original's strides, and the reduced gradients are views with the parameters'
strides (which ``AccumulateGrad`` takes without a copy).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Dict, List, Optional, Sequence, Tuple, TypeVar, Union

import torch
from torch import nn

from . import buckets

DeviceLike = Union[int, str, torch.device]
M = TypeVar("M", bound=nn.Module)


def as_device(device: DeviceLike) -> torch.device:
    """A torch.device; a bare index means a CUDA device, as in nn.DataParallel."""
    return torch.device("cuda", device) if isinstance(device, int) else torch.device(device)


def broadcast_coalesced(tensors: Sequence[torch.Tensor], devices: Sequence[DeviceLike]) -> List[List[torch.Tensor]]:
    """Copies of ``tensors`` on each of ``devices``, with the originals' strides: one flat
    bucket per dtype is copied to each device and sliced into views. On a device holding
    the originals, the originals themselves are returned (as torch's broadcast does)."""
    devices = [as_device(d) for d in devices]
    if not tensors:
        return [[] for _ in devices]
    packed = buckets.pack(tensors)
    copies: List[Any] = []
    for device in devices:
        if all(_same_device(t.device, device) for t in tensors) and not copies:
            copies.append(list(tensors))
            continue
        moved = [bucket.like(bucket.flat.to(device, non_blocking=True, copy=True)) for bucket in packed]
        copies.append(buckets.unpacked(moved, len(tensors)))
    return copies


def reduce_add_coalesced(
    inputs: Sequence[Sequence[torch.Tensor]], destination: DeviceLike, like: Sequence[torch.Tensor]
) -> List[torch.Tensor]:
    """Sum ``inputs[d][i]`` over devices ``d`` onto ``destination``. Result ``i`` has
    ``like[i]``'s layout: every device's tensors are packed into buckets with those layouts
    (a run copy for tensors that already have them), the buckets are summed, and the results
    are views of the summed buckets."""
    destination = as_device(destination)
    total: Optional[List[buckets.Bucket]] = None
    for per_device in inputs:
        source = per_device[0].device if per_device else destination
        packed = buckets.pack(list(per_device), like=like, device=source)  # new buffers: ours to add into
        if total is None:
            total = packed if _same_device(source, destination) else [b.like(b.flat.to(destination)) for b in packed]
        else:
            for acc, bucket in zip(total, packed):
                acc.flat.add_(bucket.flat.to(destination, non_blocking=True))
    return [] if total is None else buckets.unpacked(total, len(like))


def _same_device(a: torch.device, b: torch.device) -> bool:
    if a.type != b.type:
        return False
    if a.type == "cuda":
        index = torch.cuda.current_device
        return (a.index if a.index is not None else index()) == (b.index if b.index is not None else index())
    return a.index == b.index or a.index is None or b.index is None


class _Broadcast(torch.autograd.Function):
    """Replicate tensors to devices keeping strides; backward reduces the replicas' grads into
    grads with the originals' strides."""

    @staticmethod
    def forward(ctx: Any, devices: Sequence[torch.device], *tensors: torch.Tensor) -> Tuple[torch.Tensor, ...]:  # type: ignore[override]
        ctx.source = tensors[0].device if tensors else torch.device("cpu")
        ctx.count = len(tensors)
        # layouts only (meta tensors): the parameters may be updated in place before backward
        ctx.templates = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta") for t in tensors]
        copies = broadcast_coalesced(tensors, devices)
        # a replica that is the original itself comes out as a new tensor object (a view)
        outputs = [
            out.view_as(out) if out is tensors[i] else out for per_device in copies for i, out in enumerate(per_device)
        ]
        ctx.mark_non_differentiable(*[out for k, out in enumerate(outputs) if not tensors[k % ctx.count].requires_grad])
        return tuple(outputs)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Tuple[Optional[torch.Tensor], ...]:
        n = ctx.count
        per_device = [list(grads[i : i + n]) for i in range(0, len(grads), n)]
        reduced = reduce_add_coalesced(per_device, ctx.source, ctx.templates)
        return (None, *reduced)


def _broadcast(
    tensors: Sequence[torch.Tensor], devices: Sequence[torch.device], detach: bool
) -> List[List[torch.Tensor]]:
    if detach or not tensors:
        with torch.no_grad():
            return broadcast_coalesced([t.detach() for t in tensors], devices)
    flat = _Broadcast.apply(list(devices), *tensors)
    n = len(tensors)
    return [list(flat[i : i + n]) for i in range(0, len(flat), n)]


def replicate(network: M, devices: Sequence[DeviceLike], detach: bool = False) -> List[M]:
    """Replicas of ``network`` on ``devices`` (like ``torch.nn.parallel.replicate``) whose
    parameters and buffers keep the originals' strides; gradients flow back to the original
    parameters through a layout-preserving coalesced reduce. ``devices`` may be CUDA indices or
    any torch devices (CPU devices too, which is how the layout logic is tested)."""
    devices = [as_device(d) for d in devices]
    if not devices:
        return []
    params = list(network.parameters())
    buffers = list(network.buffers())
    with_grad = [b for b in buffers if b.requires_grad and not detach]
    without_grad = [b for b in buffers if not (b.requires_grad and not detach)]
    copies: Dict[int, Tuple[torch.Tensor, ...]] = {}  # id of a parameter or buffer -> its copy per device
    for tensors, detached in ((params, detach), (with_grad, False), (without_grad, True)):
        copies.update(zip(map(id, tensors), zip(*_broadcast(tensors, devices, detached))))

    modules = list(network.modules())
    module_index = {id(m): i for i, m in enumerate(modules)}
    replicas = [[module._replicate_for_data_parallel() for module in modules] for _ in devices]
    for j, mine in enumerate(replicas):
        for module, replica in zip(modules, mine):
            replica._former_parameters = OrderedDict()  # what DDP-style code reads, as torch does
            # _replicate_for_data_parallel copied _modules and _buffers (None entries too) and
            # emptied _parameters
            for key, child in module._modules.items():
                if child is not None:
                    setattr(replica, key, mine[module_index[id(child)]])
            for key, param in module._parameters.items():
                if param is None:
                    replica._parameters[key] = None
                else:
                    copy = copies[id(param)][j]
                    setattr(replica, key, copy)  # not a leaf: a plain attribute, as in torch
                    replica._former_parameters[key] = copy
            for key, buf in module._buffers.items():
                if buf is not None:
                    setattr(replica, key, copies[id(buf)][j])
    return [mine[0] for mine in replicas]  # type: ignore[misc]


class DataParallel(nn.DataParallel):
    """Drop-in for ``torch.nn.DataParallel(module, device_ids, output_device, dim)`` that
    replicates with :func:`replicate`; scatter, parallel apply and gather are torch's. Without
    GPUs it runs the module, as ``nn.DataParallel`` does."""

    def replicate(self, module: M, device_ids: Sequence[DeviceLike]) -> List[M]:  # type: ignore[override]
        return replicate(module, device_ids, not torch.is_grad_enabled())


__all__ = ["DataParallel", "broadcast_coalesced", "reduce_add_coalesced", "replicate"]
