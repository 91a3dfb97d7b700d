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

import contextlib
import os
import sys
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional, Tuple

import numpy as np

from . import log
from .agreement import Descriptor, digest, disagree
from .arrays import Buffer, data_pointer
from .transports.base import CROWDED_BURST, CROWDED_TURNS, SAME, UNPLANNED, WAITING, abandon

if TYPE_CHECKING:
    from .flow import Flow, Test

_ndarray = np.ndarray

#: Plans kept per communicator before the cache starts over.
LIMIT = 512
#: polls before a replayed call computes its deadline
SPINS = 64
#: persistent requests kept per communicator (:class:`Requests`)
REQUESTS = 64

#: a plan: runs the remembered call on an array of its geometry and returns that array
Run = Callable[[Any], Any]


class Requests:
    """The persistent requests of one flow's plans (``Transport.persistent``), by (digest,
    address): set up once per address, a repeated call only starts its request, which saves the
    MPI library building a schedule per call.

    Setting one up is collective, a persistent request matches only its own kind on the peers,
    and each rank's cache is its own (addresses differ, eviction is local). So the ranks decide
    together, in the agreement step they take anyway, by its tag: a replay passes the tag of
    the request it holds for the call (0: none), the full path :data:`UNPLANNED`. Tags number
    the collective set-ups, the same on every rank. Equal tags: every rank starts the request
    it holds, or, where none holds one (0), all set one up now. Different tags: every rank runs
    the nonblocking collective, as the full path does, and a replay drops the request it held,
    so that the next call sets up a new one on every rank. Hence persistent requests only
    where the check is on (or there are no peers)."""

    __slots__ = ("entries", "tags")

    def __init__(self) -> None:
        #: (digest, address) -> (tag, request, its Start, its Test); between calls every request
        #: here is inactive
        self.entries: Dict[Tuple[int, int], Tuple[int, Any, Callable[[], Any], Callable[[], bool]]] = {}
        #: the last tag handed out
        self.tags = 0

    def create(
        self, key: Tuple[int, int], setup: Callable[[int], Any]
    ) -> Tuple[int, Any, Callable[[], Any], Callable[[], bool]]:
        """Set up the request for ``key`` (collective: every rank at the same call); past
        :data:`REQUESTS` the oldest one goes."""
        self.tags += 1
        if len(self.entries) >= REQUESTS:
            self.entries.pop(next(iter(self.entries)))[1].Free()
        request = setup(key[1])
        entry = self.entries[key] = (self.tags, request, request.Start, request.Test)
        return entry

    def drop(self, key: Tuple[int, int]) -> None:
        """Free the request held for ``key``, if any (inactive)."""
        entry = self.entries.pop(key, None)
        if entry is not None:
            entry[1].Free()

    def release(self, keep: bool) -> None:
        """Free every request (all inactive), or with ``keep`` hand them to ``abandon`` (the
        flow's transfers may not all have completed: nothing of its communicator is freed)."""
        requests = [entry[1] for entry in self.entries.values()]
        self.entries.clear()
        if keep:
            abandon(requests)
            return
        for request in requests:
            with contextlib.suppress(Exception):  # MPI already finalized: nothing left to free
                request.Free()


def compile_plan(
    flow: "Flow", descriptor: Descriptor, buffer: Buffer, start: Callable[[int], Test],
    setup: Optional[Callable[[int], Any]] = None,
) -> Run:
    """The replay of one geometry, built by the flow (:meth:`Flow.plan`): the flow's steps after
    local validation (usable?, agreement, start, complete) with everything that cannot change
    between calls bound once. ``start(address)`` starts the collective on the span at
    ``address`` and returns its test; ``setup(address)``, where the transport has one, sets it
    up as a persistent request instead (:class:`Requests`); ``buffer`` is the first call's
    input."""
    offset = buffer.span_pointer - buffer.pointer  # from the data pointer to the span (<= 0)
    pointer_of = data_pointer if buffer.library == "numpy" else type(buffer.owner).data_ptr
    value = digest(descriptor)
    control, settle, note_failure, deadline = flow.control, flow.settle, flow.note_failure, flow.deadline
    all_equal, gave_up = control.fast_path()
    requests = flow.requests
    append, sequence = flow.recorder.fast_path() if flow.recorder else (None, int)
    entries, create, drop = requests.entries, requests.create, requests.drop
    peers = flow.size > 1
    waiting, monotonic, sched_yield = WAITING, time.monotonic, os.sched_yield
    turns, burst, spins = range(CROWDED_TURNS), range(CROWDED_BURST), range(SPINS)

    def run(x: Any) -> Any:
        if flow.broken is not None:
            flow.usable()
        address = pointer_of(x) + offset
        key = None
        began = 0.0
        if append is not None:  # the flight recorder (recorder.py); its clock reading serves the deadline too
            began = monotonic()
            append((sequence(), descriptor, began))
        try:
            if setup is not None and (flow.check or not peers):
                key = (value, address)
                entry = entries.get(key)
                agreed = SAME
                if peers:
                    timeout = flow.timeout
                    until = None if timeout is None else (began or monotonic()) + timeout
                    agreed = all_equal(value, False, until, 0 if entry is None else entry[0])
                    if not agreed:
                        disagree(control, descriptor, deadline())
                if agreed == SAME:
                    if entry is None:
                        entry = create(key, setup)
                    entry[2]()  # Start
                    test = entry[3]
                else:  # tags differ: nothing set up together; all run it as the full path does
                    key = None
                    drop((value, address))
                    test = start(address)
            else:
                if flow.check and peers and not all_equal(value, False, deadline(), UNPLANNED):
                    disagree(control, descriptor, deadline())
                test = start(address)
        except Exception as error:
            note_failure(error)  # the agreement's or the library's: a timeout gives up, as in Flow.agree
            raise
        # a small call is done before a deadline is worth computing (Waiting.poll, inline)
        if waiting.crowded:
            for _ in turns:
                for _ in burst:
                    if test():
                        break
                else:
                    sched_yield()
                    continue
                if not gave_up[0]:
                    return x
                break
        else:
            for _ in spins:
                if test():
                    if not gave_up[0]:
                        return x
                    break
        try:
            settle(test, x)  # the deadline, a peer that gave up; on failure keeps x alive
        except BaseException:
            if key is not None:
                entries.pop(key, None)  # abandoned with the transfer: never started or freed again
            raise
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


def lookup(
    plans: Dict[Any, Run], collective: str, x: Any, call: Any, writes: bool
) -> Tuple[Optional[tuple], Optional[Run]]:
    """The plan key of ``collective`` on ``x`` with the rest of the ``call`` (op, root), or None
    for arrays that plans do not replay; and the plan already made for that key, if any and if
    it may run: a replay ``writes`` without revalidating, so a NumPy array must still be
    writable then (a read-only one takes the full path, which says so)."""
    if type(x) is _ndarray:
        key: tuple = (collective, x.shape, x.strides, x.dtype, call)
        run = plans.get(key)
        if writes and run is not None and not x.flags.writeable:
            run = None
        return key, run
    if plain_torch(x):
        key = (collective, "torch", x.shape, x.stride(), x.dtype, call)
        return key, plans.get(key)
    return None, None


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
