"""The fence that orders a board's page when no MPI library provides one (a mapping made over
a key-value store, segment.py).

Why a compiled fence: Python has no memory barrier, and the board needs one between writing a
line's values and publishing its sequence number, and between seeing a peer's number and
reading its values (board.py). On x86 (TSO) stores are seen in program order and loads are not
reordered with loads, which is all the board's lines need; what TSO reorders (a load before an
earlier store) matters only to the doorbells' "raise the flag, then test" and "post, then read
the flags", where a missed wake-up costs one nap (config.NAP_SECONDS), never a hang. ARM
(Grace, Graviton) and POWER reorder stores and loads freely: without a real fence a peer could
read a line's old values under its new sequence number, a silently wrong agreement. So:

- ``denseccl._fence`` built (setup.py, C11 ``atomic_thread_fence(memory_order_seq_cst)``): that,
  on every processor;
- not built, on x86: no fence instruction (TSO is enough for the board's lines; see above);
- not built, elsewhere: no fence, hence no board (the control channel falls back to gloo or the
  store): a slower agreement rather than a wrong one.
"""

from __future__ import annotations

import platform
from typing import Callable, Optional

#: processors whose memory order is x86-TSO (by the names ``platform.machine()`` gives)
TSO = frozenset({"x86_64", "amd64", "i386", "i686", "x86"})


def _tso() -> None:
    """x86-TSO keeps store order and load order: the board's lines need no instruction."""


def page_fence(machine: Optional[str] = None) -> Optional[Callable[[], None]]:
    """The fence for a mapped board page on this processor (``machine``: ``platform.machine()``
    by default), or None where there is none that makes the board correct."""
    try:
        from .._fence import fence  # noqa: PLC0415 - optional compiled module

        return fence
    except ImportError:
        pass
    return _tso if (machine or platform.machine()).lower() in TSO else None


def describe() -> str:
    """One line for the environment report: which fence a mapped board uses here."""
    fence = page_fence()
    if fence is None:
        return f"none on {platform.machine()} (denseccl._fence not built): no board without MPI"
    if fence is _tso:
        return f"x86-TSO store order (denseccl._fence not built; {platform.machine()})"
    return "compiled (denseccl._fence: C11 atomic_thread_fence)"


__all__ = ["TSO", "describe", "page_fence"]
