"""torch's call arguments in denseccl's terms, for the process group's methods.

torch hands a backend an options object per collective (direct Python callers may pass a
ReduceOp or nothing instead), one tensor or a list, and a timeout; CUDA tensors also need their
device made current. Kept apart from the group so that each method reads as the collective it
runs. torch's reduce ops are read by the core (:func:`denseccl.ops.as_op`).
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, List, Optional, Sequence

import torch

from .. import config


def synchronous_on_host(opts: Any, tensors: Sequence[torch.Tensor]) -> bool:
    """A call torch makes synchronously (``async_op=False``) on CPU tensors: its collectives
    then run synchronously too, so that a repeated geometry runs its prepared call (calls.py)."""
    return not getattr(opts, "asyncOp", True) and all(t.device.type == "cpu" for t in tensors)


def as_list(tensors: Any) -> List[torch.Tensor]:
    """One tensor or a sequence of them, as a list."""
    return [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)


def options(opts: Any, cls: Any) -> Any:
    """torch's options object; direct Python callers may pass a ReduceOp, or nothing."""
    if isinstance(opts, cls):
        return opts
    made = cls()
    if opts is not None and hasattr(made, "reduceOp"):
        made.reduceOp = opts
    return made


def timeout_seconds(timeout: config.Seconds) -> Optional[float]:
    """torch's timeout (a timedelta or seconds), unless DENSECCL_TIMEOUT (seconds, 0 for none)
    overrides it."""
    override = config.settings().timeout
    if override is not None:
        return override or None
    return config.seconds(timeout, "timeout") or None


@contextlib.contextmanager
def cuda_context(device: Optional[torch.device]) -> Iterator[None]:
    """For CUDA tensors, make their device current (denseccl runs a torch tensor's device
    collective on torch's current stream of that device)."""
    if device is None or device.type != "cuda":
        yield
        return
    with torch.cuda.device(device):
        yield
