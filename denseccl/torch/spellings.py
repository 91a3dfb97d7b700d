"""torch.distributed's single-tensor gather and reduce-scatter under torch 2.13's names, or the
old ones on older torch (docs/torch.md, Both spellings): denseccl's own callers take them from
here, so that no deprecation warning comes from denseccl on any torch it supports.
"""

from __future__ import annotations

from typing import Any, Callable

import torch.distributed as dist

all_gather_single: Callable[..., Any] = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_single: Callable[..., Any] = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

__all__ = ["all_gather_single", "reduce_scatter_single"]
