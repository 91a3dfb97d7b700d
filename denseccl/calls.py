"""Calls: what the engine (:meth:`~denseccl.flow.Flow.run`) runs, validated.

A synchronous, in-place call on a NumPy array or a :func:`plain_torch` tensor validates the
same way every time for the same (collective, shape, strides, dtype, op, root): the first such
call is validated into a :func:`prepared` :class:`Call` (descriptor, digest, the transport's
prepared start, and how to find the span from the array) that the communicator's flow keeps;
a repeated call runs it (:meth:`~denseccl.flow.Flow.replay`). Every other call is validated
each time into a :func:`general` Call of its own, which the engine runs the same way.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Optional

from . import log
from .agreement import Descriptor, digest
from .arrays import Buffer, data_pointer
from .backends.base import DONE, Pending, Start, Step


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


def plain_torch(x: Any) -> bool:
    """Whether ``x`` is a torch tensor whose calls are cached: exactly ``torch.Tensor`` (not a
    subclass), on the CPU, strided, with neither the conjugate nor the negative bit set."""
    torch = sys.modules.get("torch")
    return (
        torch is not None and type(x) is torch.Tensor and x.is_cpu and x.layout is torch.strided
        and not x.is_conj() and not x.is_neg()
    )


__all__ = ["Call", "general", "plain_torch", "prepared"]
