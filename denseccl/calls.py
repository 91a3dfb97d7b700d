"""Prepared calls: a call validated once, and the communicator's cache of them.

A synchronous, in-place call on a NumPy array or a plain CPU torch tensor validates the same
way every time for the same (collective, shape, strides, dtype, op, root): the layout, the dense
rule, the op-dtype checks and the agreement descriptor are functions of those alone. So the
first such call validates into a :class:`Call` (descriptor, digest, the transport's prepared
start, and how to find the span from the array) that the communicator keeps under
:func:`lookup`'s key; a repeated call looks it up and goes straight to the engine
(:meth:`~denseccl.flow.Flow.run`), as the first call did. Every other call (``out=``, async,
a device array, allgather, reduce-scatter, barrier) is validated each time into a Call of its
own that the engine runs the same way.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Dict, Optional, Tuple

import numpy as np

from . import config, log
from .agreement import Descriptor, digest
from .arrays import Buffer, data_pointer
from .backends.base import DONE, Pending, Start, Step

_ndarray = np.ndarray


def _nothing_lost(address: int) -> None:
    """A general call holds nothing that outlives its transfer."""


class Call:
    """One validated call for the engine. ``start(address)`` starts the transfer (after the
    agreement) and returns its test where ``tested`` (a host call waited for at once), else a
    :class:`Pending`. ``step``, ``lost``: the transport's (``base.Start``), for prepared
    calls. ``offset`` and ``pointer_of`` find the span of a later array of the same geometry
    (``pointer_of(x) + offset``)."""

    __slots__ = (
        "descriptor", "value", "start", "step", "lost", "tested", "offset", "pointer_of", "tracing", "repeated",
    )

    def __init__(
        self,
        descriptor: Descriptor,
        start: Callable[[int], Any],
        *,
        tested: bool = False,
        step: Optional[Step] = None,
        lost: Callable[[int], None] = _nothing_lost,
        offset: int = 0,
        pointer_of: Optional[Callable[[Any], int]] = None,
    ) -> None:
        self.descriptor = descriptor
        self.value = digest(descriptor)
        self.start = start
        self.tested = tested
        self.step = step
        self.lost = lost
        self.offset = offset
        self.pointer_of = pointer_of
        #: DENSECCL_DEBUG=TRACE when the call was prepared: the engine times it
        self.tracing = log.tracing()
        #: it has run before (a cache hit): the trace says so
        self.repeated = False


def general(descriptor: Descriptor, start: Optional[Callable[..., Pending]], *args: Any) -> Call:
    """A call validated for this time only: ``start(*args)`` (None: nothing to move)."""
    if start is None:
        return Call(descriptor, _done)
    return Call(descriptor, lambda _address: start(*args))


def _done(_address: int) -> Pending:
    return DONE


def prepared(descriptor: Descriptor, start: Start, buffer: Buffer) -> Call:
    """The cached call of ``buffer``'s geometry on the transport's prepared ``start``."""
    pointer_of = data_pointer if buffer.library == "numpy" else type(buffer.owner).data_ptr
    return Call(
        descriptor, start.start, tested=True, step=start.step, lost=start.lost,
        offset=buffer.span_pointer - buffer.pointer, pointer_of=pointer_of,
    )


def lookup(
    calls: Dict[Any, Call], collective: str, x: Any, call: Any, writes: bool
) -> Tuple[Optional[tuple], Optional[Call]]:
    """The cache key of ``collective`` on ``x`` with the rest of the ``call`` (op, root), or
    None for arrays whose calls are not cached; and the call prepared for that key, if any and
    if it may run on ``x`` without revalidating: a call that ``writes`` needs a writable NumPy
    array (a read-only one takes the validating path, which says so)."""
    if type(x) is _ndarray:
        key: tuple = (collective, x.shape, x.strides, x.dtype, call)
        found = calls.get(key)
        if writes and found is not None and not x.flags.writeable:
            found = None
        return key, found
    if plain_torch(x):
        key = (collective, "torch", x.shape, x.stride(), x.dtype, call)
        return key, calls.get(key)
    return None, None


def plain_torch(x: Any) -> bool:
    """Whether ``x`` is a torch tensor whose calls are cached: exactly ``torch.Tensor`` (not a
    subclass), on the CPU, strided, with neither the conjugate nor the negative bit set."""
    torch = sys.modules.get("torch")
    return (
        torch is not None and type(x) is torch.Tensor and x.is_cpu and x.layout is torch.strided
        and not x.is_conj() and not x.is_neg()
    )


def remember(calls: Dict[Any, Call], key: Any, call: Call) -> None:
    """Keep ``call`` under ``key``; past :data:`config.PREPARED_CALLS` the cache starts over."""
    if len(calls) >= config.PREPARED_CALLS:
        calls.clear()
    calls[key] = call


__all__ = ["Call", "general", "lookup", "plain_torch", "prepared", "remember"]
