"""How a rank waits: the one wait loop (:func:`wait_until`, with :func:`soon` for its first
polls) and the process's crowded policy (:data:`WAITING`).

Every wait in denseccl (a transfer, the agreement step, a bootstrap step, the torch adapter's
progress thread) is :func:`wait_until`. Its shape depends on one fact of the host, recorded in
:data:`WAITING` by the backend's bootstrap (denseccl/channel/cores.py): whether the host's ranks
share cores. Uncrowded, a wait polls before it gives the core up, as a peer on another core
answers within microseconds; crowded, polling only keeps the peer that must run off the core.
``DENSECCL_WAIT`` overrides the detection; the tuning constants live in config.py.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, List, Optional

from . import config
from .errors import timeout_error

#: a transfer's (or any wait's) test: True once done, never blocks
Test = Callable[[], bool]


class Waiting:
    """This process's waiting policy (one for the whole process: whether a peer shares this
    rank's core is a fact of the host, not of a communicator)."""

    __slots__ = ("crowded", "doorbells", "_live")

    def __init__(self) -> None:
        #: the host's ranks share cores: never poll more than a burst without giving the core up
        self.crowded = False
        #: where crowded waits sleep (an object with ``size``, ``ring()`` and ``doze(test)``:
        #: denseccl/channel/doorbell.py), the largest set of a live communicator, or None: they yield
        self.doorbells: Any = None
        #: every live communicator's doorbells: a rank rings them all, so that a peer asleep on
        #: any of them wakes
        self._live: List[Any] = []

    def note(self, crowded: bool, doorbells: Any = None) -> None:
        """Record what bootstrap found, unless ``DENSECCL_WAIT`` says otherwise. Only ever
        turns crowding on: a sub-communicator's ranks compete for the cores with every other
        rank of the host. ``doorbells``: its communicator's, until :meth:`forget`."""
        policy = config.settings().wait
        self.crowded = policy == "yield" or (policy == "auto" and (self.crowded or crowded))
        if policy == "auto" and doorbells is not None:
            self._live.append(doorbells)
            self._choose()

    def forget(self, doorbells: Any) -> None:
        """A communicator closed: its doorbells (and the memory behind them) go."""
        self._live = [live for live in self._live if live is not doorbells]
        self._choose()

    def _choose(self) -> None:
        self.doorbells = max(self._live, key=lambda live: live.size, default=None)

    def spins(self, spins: int) -> int:
        """How many of ``spins`` polls a caller may make before it gives the core up."""
        return 0 if self.crowded else spins

    def ring(self) -> None:
        """Wake the peers that sleep on their doorbells (crowded hosts; else nothing)."""
        if self.crowded:
            for doorbells in self._live:
                doorbells.ring()


#: this process's waiting policy
WAITING = Waiting()


def deadline_after(seconds: Optional[float]) -> Optional[float]:
    """The ``time.monotonic()`` value ``seconds`` from now (None: no deadline)."""
    return None if seconds is None else time.monotonic() + seconds


def soon(
    test: Test,
    _waiting: Waiting = WAITING,
    _spins: range = range(config.SPINS),
    _turns: range = range(config.CROWDED_TURNS),
    _burst: range = range(config.CROWDED_BURST),
    _yield: Callable[[], None] = os.sched_yield,
) -> bool:
    """The first polls of a wait, before a deadline is worth computing: True once ``test()``
    is. Uncrowded, :data:`config.SPINS` polls; crowded, :data:`config.CROWDED_TURNS` turns of
    :data:`config.CROWDED_BURST` polls, each turn then yielding the core to the peer that
    shares it. A small call completes here (the defaults are bound once: this runs on every
    call)."""
    if not _waiting.crowded:
        for _ in _spins:
            if test():
                return True
        return False
    for _ in _turns:
        for _ in _burst:
            if test():
                return True
        _yield()
    return False


def wait_until(
    test: Test,
    deadline: Optional[float],
    what: str,
    spins: int = config.SPINS,
    burst: int = config.CROWDED_BURST,
    watch: Optional[Callable[[], None]] = None,
) -> None:
    """Poll ``test`` until it is true: spin ``spins`` times first (latency), then yield the core
    after every poll, then sleep briefly (a long wait for a slow peer should not burn a core).
    Crowded (:class:`Waiting`), it gives the core up from the first turn on, after a burst of
    ``burst`` polls each turn (1 for a test only a peer can make true): it yields, and after
    :data:`config.CROWDED_YIELDS` yields it sleeps on its doorbell where the host has them.
    ``watch``, called once a turn before the core is given up, raises if the wait is
    hopeless (a peer gave up). Raise :class:`CollectiveTimeoutError` once ``deadline`` has
    passed."""
    per_turn, doorbells = 1, None
    if WAITING.crowded:
        spins, per_turn, doorbells = 0, burst, WAITING.doorbells
    for _ in range(spins):
        if test():
            return
    started = time.monotonic()
    doze = None  # the doorbell's sleep, once yielding has lasted long enough
    turns = 0
    while True:
        for _ in range(per_turn):
            if test():
                if doze is not None:
                    WAITING.ring()  # a peer may sleep waiting for what this completion did
                return
        if watch is not None:
            watch()
        turns += 1
        if turns % config.CLOCK_TURNS:
            if doze is None:
                os.sched_yield()
                if turns >= config.CROWDED_YIELDS and doorbells is not None:
                    doze = doorbells.doze
                    doorbells.ring()  # a peer may sleep waiting for what this wait's polls moved
            elif doze(test):
                WAITING.ring()
                return
            continue
        now = time.monotonic()
        if deadline is not None and now > deadline:
            raise timeout_error(what)
        if now - started > config.IDLE_AFTER_SECONDS:
            _idle(test, deadline, what, watch, doorbells)
            return
        if doorbells is None and now - started > config.SLEEP_AFTER_SECONDS:
            time.sleep(config.SLEEP_SECONDS)


def _idle(
    test: Test, deadline: Optional[float], what: str, watch: Optional[Callable[[], None]], doorbells: Any
) -> None:
    """The rest of a wait that has lasted :data:`config.IDLE_AFTER_SECONDS`: a test, then a
    sleep (on the doorbell where there is one: a ring ends it), until ``test()`` or the deadline."""
    while True:
        if doorbells is not None:
            if doorbells.doze(test, True):
                break
        elif test():
            break
        else:
            time.sleep(config.IDLE_SECONDS)
        if watch is not None:
            watch()
        if deadline is not None and time.monotonic() > deadline:
            raise timeout_error(what)
    WAITING.ring()  # a peer may sleep waiting for what this completion did


__all__ = ["WAITING", "Test", "Waiting", "deadline_after", "soon", "wait_until"]
