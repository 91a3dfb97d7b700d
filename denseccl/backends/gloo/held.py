"""The tensors a gloo call was given are let go of in Python, never by gloo's threads.

Why: a tensor made in Python (a span view, a temporary) whose Python object dies while gloo
still holds the tensor is preserved for C++ (torch keeps the Python object alive), and whichever
thread drops the last reference then releases a Python object, so it takes the GIL. gloo's
worker threads drop a Work just after completing it, that is after the caller's ``wait()``
returned: the worker then waits for the GIL while the caller runs Python, a hand-over of the
GIL on every call; and once the interpreter is finalizing (a program that ends without
``close()``), taking the GIL ends the worker thread inside a C++ destructor, and the process
aborts ("terminate called without an active exception").

So each call's tensors stay held here until gloo's own references are gone
(``Tensor._use_count()`` is 1: the Python object's own), which is usually the case by the next
call; :meth:`Held.drain` waits for the rest when a group closes, and at interpreter exit for every
group still open.
"""

from __future__ import annotations

import atexit
import time
import weakref
from collections import deque
from typing import Any, Deque, Sequence

#: how long :meth:`Held.drain` waits for gloo's threads by default (they let go within
#: microseconds of completing a call; only a call still running holds on)
DRAIN_SECONDS = 2.0
#: entries held after which :meth:`Held.hold` looks past the oldest (one gloo never let go of)
SWEEP_AFTER = 64
#: what gloo still held when its group closed (a call that never completed): kept for the
#: process's life, so that no thread of gloo's ever releases a Python object
_STUCK: list = []


def _released(tensors: Sequence[Any]) -> bool:
    return all(tensor._use_count() <= 1 for tensor in tensors)


def _let_go(held: Deque[Sequence[Any]], every: bool) -> None:
    """Drop the entries of ``held`` that gloo let go of: the oldest ones, up to the first it
    still holds, or (``every``) all of them. Threads may call this at once (a caller and the
    torch adapter's progress thread): only whole deque operations, each atomic, and an entry
    taken out is put back unless it was released, so none is ever dropped unchecked."""
    for _ in range(len(held)):
        try:
            entry = held.popleft()
        except IndexError:
            return
        if not _released(entry):
            if not every:
                held.appendleft(entry)
                return
            held.append(entry)


class Held:
    """The tensors of one gloo group's completed calls that gloo may still reference."""

    __slots__ = ("_held", "__weakref__")

    def __init__(self) -> None:
        self._held: Deque[Sequence[Any]] = deque()
        _OPEN.add(self)

    def hold(self, tensors: Sequence[Any]) -> None:
        """Keep ``tensors`` (a completed call's) until gloo lets go of them; release the
        oldest ones gloo has let go of."""
        held = self._held
        held.append(tensors)
        _let_go(held, every=False)
        if len(held) > SWEEP_AFTER:  # behind a call gloo still runs (it timed out): keep only what gloo holds
            _let_go(held, every=True)

    def drain(self, seconds: float = DRAIN_SECONDS) -> None:
        """Wait (sleeping, the GIL released) up to ``seconds`` for gloo to let go of every
        tensor held; what it still holds then is kept for the process's life."""
        held = self._held
        limit = time.monotonic() + seconds
        while True:
            _let_go(held, every=True)
            if not held:
                return
            if time.monotonic() >= limit:
                while held:
                    _STUCK.append(held.popleft())
                return
            time.sleep(0.0005)

    def __len__(self) -> int:
        return len(self._held)


_OPEN: "weakref.WeakSet[Held]" = weakref.WeakSet()


@atexit.register
def _drain_all() -> None:
    """Before the interpreter finalizes: every group's tensors released by this thread."""
    for held in list(_OPEN):
        held.drain()


__all__ = ["DRAIN_SECONDS", "Held"]
