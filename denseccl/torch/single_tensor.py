"""torch.distributed's single-tensor gather and reduce-scatter under torch 2.13's names, or the
old ones on older torch (docs/torch.md, Both spellings): denseccl's own callers take them from
here, so that no deprecation warning comes from denseccl on any torch it supports.

torch 2.11 (the GPU machine's) has only ``all_gather_into_tensor`` / ``reduce_scatter_tensor``;
2.13 adds ``all_gather_single`` / ``reduce_scatter_single`` and deprecates the old names. The
process group answers both generations of method names (``process_group.py``,
``gather_scatter.py``); tests/torch/test_torch_versions.py holds both to it.
"""

from __future__ import annotations

from typing import Any, Callable, Tuple

import torch.distributed as dist


def single_tensor_collectives(namespace: Any) -> Tuple[Callable[..., Any], Callable[..., Any]]:
    """``(all_gather_single, reduce_scatter_single)`` of ``namespace`` (``torch.distributed``):
    the new names where it has them, else the old ones they replace."""
    gather = getattr(namespace, "all_gather_single", None) or namespace.all_gather_into_tensor
    scatter = getattr(namespace, "reduce_scatter_single", None) or namespace.reduce_scatter_tensor
    return gather, scatter


all_gather_single, reduce_scatter_single = single_tensor_collectives(dist)

__all__ = ["all_gather_single", "reduce_scatter_single", "single_tensor_collectives"]
