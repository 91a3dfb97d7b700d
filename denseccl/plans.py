"""Plans: the fast path for a call that repeats a geometry seen before.

A synchronous, in-place call on a NumPy array or a plain CPU torch tensor validates the same
way every time for the same (collective, shape, strides, dtype, op, root): the layout, the dense
rule, the op-dtype checks and the agreement descriptor are functions of those alone. The first such call runs the full
path, whose flow then builds a plan (:meth:`Flow.plan`, :func:`compile_plan`); later calls with
the same key replay only what can change between calls (the data pointer, the writable flag,
the communicator's state) through the flow's own steps, and still run the cross-rank agreement
check when it is on. A small call then costs about a microsecond of
Python on top of MPI.
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional, Tuple

import numpy as np

from . import log
from .agreement import Descriptor, digest, disagree
from .arrays import Buffer, data_pointer
from .transports.base import WAITING

if TYPE_CHECKING:
    from .flow import Flow, Test

_ndarray = np.ndarray

#: Plans kept per communicator before the cache starts over.
LIMIT = 512
#: polls before a replayed call computes its deadline
SPINS = 64

#: a plan: runs the remembered call on an array of its geometry and returns that array
Run = Callable[[Any], Any]


def compile_plan(flow: "Flow", descriptor: Descriptor, buffer: Buffer, start: Callable[[int], Test]) -> Run:
    """The replay of one geometry, built by the flow (:meth:`Flow.plan`): the flow's steps after
    local validation (usable?, agreement, start, complete) with everything that cannot change
    between calls bound once. ``start(address)`` starts the collective on the span at
    ``address`` and returns its test; ``buffer`` is the first call's input."""
    offset = buffer.span_pointer - buffer.pointer  # from the data pointer to the span (<= 0)
    pointer_of = data_pointer if buffer.library == "numpy" else type(buffer.owner).data_ptr
    value = digest(descriptor)
    control, settle, note_failure, deadline = flow.control, flow.settle, flow.note_failure, flow.deadline
    all_equal, gave_up = control.fast_path()
    peers = flow.size > 1
    spins = WAITING.spins(SPINS)  # none where ranks share cores: the peer needs this one

    def run(x: Any) -> Any:
        if flow.broken is not None:
            flow.usable()
        try:
            if flow.check and peers and not all_equal(value, False, deadline()):
                disagree(control, descriptor, deadline())
            test = start(pointer_of(x) + offset)
        except Exception as error:
            note_failure(error)  # the agreement's or the library's: a timeout gives up, as in Flow.agree
            raise
        for _ in range(spins):  # a small call is done before a deadline is worth computing
            if test():
                if not gave_up[0]:
                    return x
                break
        settle(test, x)  # the deadline, a peer that gave up; on failure keeps x alive
        return x

    if not log.tracing():
        return run
    replay, what = run, descriptor.describe()

    def traced(x: Any) -> Any:
        began = time.perf_counter()
        result = replay(x)
        log.trace("%s (plan): %.1f us", what, (time.perf_counter() - began) * 1e6)
        return result

    return traced


def lookup(plans: Dict[Any, Run], collective: str, x: Any, call: Any) -> Tuple[Optional[tuple], Optional[Run]]:
    """The plan key of ``collective`` on ``x`` with the rest of the ``call`` (op, root), or None
    for arrays that plans do not replay; and the plan already made for that key, if any."""
    if type(x) is _ndarray:
        key: tuple = (collective, x.shape, x.strides, x.dtype, call)
    elif plain_torch(x):
        key = (collective, "torch", x.shape, x.stride(), x.dtype, call)
    else:
        return None, None
    return key, plans.get(key)


def writable(x: Any) -> bool:
    """A replay writes without revalidating: a NumPy array must still be writable."""
    return type(x) is not _ndarray or bool(x.flags.writeable)


def plain_torch(x: Any) -> bool:
    """Whether ``x`` is a torch tensor a plan can replay: exactly ``torch.Tensor`` (not a
    subclass), on the CPU, strided, with neither the conjugate nor the negative bit set."""
    torch = sys.modules.get("torch")
    return (
        torch is not None and type(x) is torch.Tensor and x.is_cpu and x.layout is torch.strided
        and not x.is_conj() and not x.is_neg()
    )


def remember(plans: Dict[Any, Run], key: Any, run: Run) -> None:
    if len(plans) >= LIMIT:
        plans.clear()
    plans[key] = run
