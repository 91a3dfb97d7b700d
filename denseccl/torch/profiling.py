"""torch.profiler ranges of the ``denseccl`` backend (docs/torch.md, Profiling).

Every call of the process group records one range, ``denseccl:<collective>`` (named as gloo
names its own: ``denseccl:all_reduce``, ``denseccl:all_gather``, ...), carrying the input
tensors, so that a profiler run with ``record_shapes=True`` shows their shapes and dtypes; each
agreement step inside it records ``denseccl:agreement``, so a trace shows what the check
costs. Under torchrun the gloo engine's own ranges (``gloo:all_reduce``) nest inside.

When no profiler records, a call pays one test of torch's ``_profiler_enabled()`` (a C call of
tens of nanoseconds) per range, and nothing else: a range object is made only while a profiler
records. The ranges are torch's ``_RecordFunctionFast`` (the one inductor's generated code
uses), a fraction of ``record_function``'s cost.
"""

from __future__ import annotations

import functools
import types
from typing import Any, Callable, ContextManager, Dict, List, Optional, Tuple

import torch
from torch._C._autograd import _profiler_enabled  # type: ignore[attr-defined]
from torch._C._profiler import _RecordFunctionFast  # type: ignore[attr-defined]

from .. import flow

AGREEMENT = "denseccl:agreement"

#: the process group's methods that record a range: method -> (collective, the position of the
#: argument that holds its input tensors, None for none). The names follow gloo's ranges.
RANGES: Dict[str, Tuple[str, Optional[int]]] = {
    "allreduce": ("all_reduce", 0),
    "allreduce_coalesced": ("all_reduce_coalesced", 0),
    "reduce": ("reduce", 0),
    "broadcast": ("broadcast", 0),
    "barrier": ("barrier", None),
    "allgather": ("all_gather", 1),
    "allgather_coalesced": ("all_gather_coalesced", 1),
    "all_gather_single": ("all_gather", 1),
    "_allgather_base": ("all_gather", 1),
    "all_gather_single_coalesced": ("all_gather_coalesced", 1),
    "allgather_into_tensor_coalesced": ("all_gather_coalesced", 1),
    "reduce_scatter": ("reduce_scatter", 1),
    "reduce_scatter_single": ("reduce_scatter", 1),
    "_reduce_scatter_base": ("reduce_scatter", 1),
    "reduce_scatter_single_coalesced": ("reduce_scatter_coalesced", 1),
    "reduce_scatter_tensor_coalesced": ("reduce_scatter_coalesced", 1),
    "gather": ("gather", 1),
    "scatter": ("scatter", 1),
    "all_to_all_single": ("all_to_all", 1),
    "alltoall_base": ("all_to_all", 1),
    "alltoall": ("all_to_all", 1),
    "send": ("send", 0),
    "recv": ("recv", 0),
    "recv_anysource": ("recv", 0),
}


def _tensors(given: Any) -> List[Any]:
    """The tensors in an argument: a tensor, or a list of them (or of lists)."""
    if isinstance(given, torch.Tensor):
        return [given]
    if isinstance(given, (list, tuple)):
        return [t for item in given for t in _tensors(item)]
    return []


def traced(method: Callable[..., Any], collective: str, inputs: Optional[int]) -> Callable[..., Any]:
    """``method`` of the process group, recording the range ``denseccl:<collective>`` around
    each call while a profiler records."""
    name = f"denseccl:{collective}"

    @functools.wraps(method)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not _profiler_enabled():
            return method(self, *args, **kwargs)
        given = _tensors(args[inputs]) if inputs is not None and len(args) > inputs else []
        with _RecordFunctionFast(name, given):
            return method(self, *args, **kwargs)

    call.denseccl_range = name  # type: ignore[attr-defined]
    return call


def trace_methods(cls: type) -> type:
    """Replace each of :data:`RANGES`' methods that ``cls`` defines in Python (not torch's own
    bindings) with its traced form, once."""
    for attribute, (collective, inputs) in RANGES.items():
        method = getattr(cls, attribute, None)
        if isinstance(method, types.FunctionType) and not hasattr(method, "denseccl_range"):
            setattr(cls, attribute, traced(method, collective, inputs))
    return cls


def agreement_range() -> Optional[ContextManager[Any]]:
    """The range of one agreement step while a profiler records, else None."""
    return _RecordFunctionFast(AGREEMENT) if _profiler_enabled() else None


def enable() -> None:
    """Mark every agreement step of this process's communicators (the core's hook)."""
    flow.trace_agreement(agreement_range)


__all__ = ["AGREEMENT", "RANGES", "agreement_range", "enable", "trace_methods", "traced"]
