"""torch Work objects for denseccl operations, and the progress thread that completes them.

A torch collective maps to one or more *steps* (denseccl ``Work`` objects, or the request steps
of :mod:`.all_to_all_p2p`: anything with a non-blocking ``is_completed()`` and ``wait(timeout)``)
plus a host-side *finish* (copying a staged result into the user's tensors). Two ways to completion:

- ``opts.asyncOp`` false (``dist.all_reduce(..., async_op=False)``): the steps are waited on at
  once and torch gets a Work built from an already completed future
  (``_create_work_from_future``).
- otherwise (``async_op=True``, DDP's reducer, FSDP): torch gets an :class:`AsyncWork` whose
  ``torch.futures.Future`` the group's :class:`Progress` thread completes when the steps have
  completed. Callers that block in C++ on that future (DDP's ``finalize_backward``) are woken by
  that thread; a Python ``wait()`` drives the steps itself and returns sooner.
- a CUDA operation whose steps are all *stream-ordered* (NCCL collectives: waiting on one only
  makes the current stream wait for it) completes its future at once, in the caller's thread,
  as ProcessGroupNCCL's does: the steps order the caller's current stream after them, the
  finish is queued there, and the CUDA future's ``set_result`` records an event on that stream,
  which every consumer's stream (``wait()``, ``then`` callbacks) waits for. The host never waits
  for the GPU, so DDP's ``finalize_backward`` returns while the buckets' allreduces still run and
  the optimizer's kernels queue behind them. Their timeout is the transport's watchdog's.

Past an operation's deadline the thread fails a step still running by waiting on it with no time
left (``CollectiveTimeoutError``). A step whose transport times it out itself (``watched``: NCCL,
whose watchdog aborts the communicator) is left to that verdict: waiting on a device step orders
streams, which a CUDA graph capture in global mode forbids, so the thread never does it for one.

Only one thread at a time tests a step (one lock per group), as MPI requires of a request.
"""

from __future__ import annotations

import atexit
import functools
import os
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable, List, Optional

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future  # type: ignore[attr-defined]

from .. import config
from ..transport import abandon


@dataclass(eq=False)
class Operation:
    """One torch-level call in flight: its steps, its finish, its future."""

    name: str
    steps: List[Any]
    finish: Callable[[], Any]
    future: torch.futures.Future
    deadline: Optional[float]
    done: bool = False
    #: called with the error of a failed operation whose peers must learn it (all-to-all and
    #: point-to-point: all_to_all_p2p.Engine.breaks); its steps are then kept for good
    on_failure: Optional[Callable[[BaseException], None]] = None


def stream_ordered(operation: Operation) -> bool:
    """Whether every step of ``operation`` completes on a CUDA stream and waiting on it only
    orders the caller's current stream (``Work.stream_ordered``), with nothing to tell peers on
    failure: then its future may complete before the GPU has run it."""
    return operation.on_failure is None and all(getattr(step, "stream_ordered", False) for step in operation.steps)


def new_future(device: Optional[torch.device]) -> torch.futures.Future:
    if device is not None and device.type == "cuda":
        return torch.futures.Future(devices=[device])
    return torch.futures.Future()


class Progress:
    """Completes the futures of one process group's operations, in a daemon thread started on
    the first asynchronous operation. It polls while operations are in flight (MPI progresses
    only inside MPI calls, so polling also moves the data of long transfers along), at the pace
    the ``config.PROGRESS_*_SECONDS`` constants set."""

    def __init__(self, name: str) -> None:
        self.name = name
        # held while testing or waiting on steps; reentrant because a future's callbacks run
        # where it is completed and may wait on other operations
        self.lock = threading.RLock()
        self._wake = threading.Condition()
        self._inflight: List[Operation] = []
        self._thread: Optional[threading.Thread] = None
        self._stopping = False
        self._stop_by = 0.0
        self._active = 0.0  # when an operation was last submitted or completed
        #: an operation was given up on at shutdown: what it ran on may still be in use
        self.abandoned = False
        #: seconds between polls: DENSECCL_TORCH_POLL (0 spins, yielding the core) or the default
        poll = config.settings().torch_poll
        self.poll = config.PROGRESS_POLL_SECONDS if poll is None else poll
        _LIVE.add(self)

    # -- called by the process group --------------------------------------------------------

    def submit(self, operation: Operation) -> None:
        with self._wake:
            if self._stopping:
                raise RuntimeError(f"{self.name}: the process group has been shut down")
            self._inflight.append(operation)
            self._active = time.monotonic()
            if self._thread is None:
                _register_exit_hook()
                self._thread = threading.Thread(target=self._run, name=f"{self.name}-progress", daemon=True)
                self._thread.start()
            self._wake.notify()

    def launch(self, operation: Operation, device: Optional[torch.device]) -> None:
        """Track an asynchronous ``operation`` started on ``device``'s current stream: a CUDA
        operation whose steps are stream-ordered completes now, in this thread (its future's
        value is ready on the current stream, see the module's docstring); any other is
        submitted to the progress thread."""
        if device is not None and device.type == "cuda" and stream_ordered(operation):
            with self.lock:
                self._finish(operation, blocking=True)
            return
        self.submit(operation)

    def wait(self, operation: Operation, timeout: Optional[float] = None) -> None:
        """Block until ``operation`` has completed, driving its steps from this thread;
        re-raise its error."""
        if not operation.done:
            with self.lock:
                if not operation.done:
                    self._finish(operation, blocking=True, timeout=timeout)
        # raises the operation's error; for CUDA tensors it also makes this thread's current
        # stream wait for the finish (which may have run on the progress thread's stream)
        operation.future.wait()

    def test(self, operation: Operation) -> bool:
        if not operation.done and self.lock.acquire(blocking=False):
            try:
                if not operation.done:
                    self._finish(operation, blocking=False)
            finally:
                self.lock.release()
        return operation.done and operation.future.done()

    def stop(self, grace: float = 10.0) -> bool:
        """Stop the thread after completing what is in flight, for at most ``grace`` seconds;
        operations still in flight then fail, and their buffers are kept alive for good (MPI
        may still write into them, e.g. during MPI_Finalize). True when nothing was left in
        flight: only then may the communicators the operations ran on be freed."""
        with self._wake:
            if not self._stopping:
                self._stopping = True
                self._stop_by = time.monotonic() + grace
            self._wake.notify()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=grace + 5)
        return not self.abandoned and (thread is None or not thread.is_alive())

    # -- internals ---------------------------------------------------------------------------

    def _finish(self, operation: Operation, *, blocking: bool, timeout: Optional[float] = None) -> None:
        """With ``self.lock`` held: complete ``operation`` if its steps are done (all of them,
        waiting when ``blocking``), run its finish and settle its future."""
        try:
            if blocking:
                for step in operation.steps:
                    step.wait(timeout)
            else:
                for step in operation.steps:
                    if not step.is_completed():
                        if _overdue(operation) and not getattr(step, "watched", False):
                            step.wait(0)  # raises CollectiveTimeoutError, marks the communicator broken
                            continue
                        watch = getattr(step, "watch", None)
                        if watch is not None:
                            watch()  # raises once a peer gave up
                        return  # a watched step's transport fails it at its timeout (see Work.watched)
                    step.wait()  # completed: releases what the step kept alive
            value = operation.finish()
        except BaseException as error:  # the future carries it to every waiter
            operation.done = True
            failed(operation, error)
            if isinstance(error, Exception):
                operation.future.set_exception(error)
                return
            # an interrupt in this (the caller's) thread: raised here; a future holds Exceptions only
            operation.future.set_exception(RuntimeError(f"{operation.name} was interrupted ({type(error).__name__})"))
            raise
        operation.done = True
        operation.future.set_result(value)

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._inflight and not self._stopping:
                    self._wake.wait(timeout=1.0)
                if self._stopping and not self._inflight:
                    return
                pending = list(self._inflight)
            settled = []
            with self.lock:
                for operation in pending:
                    if not operation.done:
                        self._finish(operation, blocking=False)
                    if operation.done:
                        settled.append(operation)
            if settled:
                self._active = time.monotonic()
                with self._wake:
                    self._inflight = [op for op in self._inflight if not op.done]
            if self._stopping and time.monotonic() > self._stop_by:
                with self._wake:
                    for operation in self._inflight:
                        if not operation.done:
                            operation.done = True
                            self.abandoned = True
                            abandon(operation.steps)
                            operation.future.set_exception(
                                RuntimeError(f"{self.name}: shut down with {operation.name} in flight")
                            )
                    self._inflight = []
                return
            # a long transfer needs polls less often than a short one
            quiet = time.monotonic() - self._active
            if self.poll == 0 or quiet < config.PROGRESS_SPIN_SECONDS:
                os.sched_yield()
            else:
                time.sleep(self.poll if quiet < config.PROGRESS_QUIET_SECONDS else 10 * self.poll)


def failed(operation: Operation, error: BaseException) -> None:
    """What a failed operation with an ``on_failure`` does: keep its steps (a request that never
    completed may still write its buffers), then tell it."""
    if operation.on_failure is not None:
        abandon(operation.steps)
        operation.on_failure(error)


def _overdue(operation: Operation) -> bool:
    return operation.deadline is not None and time.monotonic() > operation.deadline


_LIVE: "weakref.WeakSet[Progress]" = weakref.WeakSet()


@functools.lru_cache(maxsize=None)
def _register_exit_hook() -> None:
    """Stop the progress threads at exit, before MPI is finalized: registered (once) when the
    first thread starts, i.e. after mpi4py registered MPI_Finalize, so it runs first (LIFO)."""
    atexit.register(_stop_all)


def _stop_all() -> None:
    for progress in list(_LIVE):
        progress.stop()


class AsyncWork(dist.Work):
    """The Work torch gets for an asynchronous denseccl operation."""

    def __init__(
        self, progress: Progress, operation: Operation, source_rank: Optional[Callable[[], int]] = None
    ) -> None:
        super().__init__()
        self._progress = progress
        self._operation = operation
        self._source = source_rank

    def wait(self, timeout: Any = None) -> bool:
        # torch passes a timedelta (0 meaning none); Python callers may pass seconds
        self._progress.wait(self._operation, config.seconds(timeout, "timeout") or None)
        return True

    def get_future(self) -> torch.futures.Future:
        return self._operation.future

    def is_completed(self) -> bool:
        return self._progress.test(self._operation)

    def is_success(self) -> bool:
        if not self._operation.future.done():
            raise RuntimeError("is_success() called on a Work that has not completed")
        return self.exception() is None

    def exception(self) -> Optional[BaseException]:
        future = self._operation.future
        if not future.done():
            return None
        try:
            future.value()
        except Exception as error:  # noqa: BLE001
            return error
        return None

    def result(self) -> List[torch.Tensor]:
        self.wait()
        value = self._operation.future.value()
        return value if isinstance(value, list) else []

    def synchronize(self) -> None:
        self.wait()

    block_current_stream = synchronize

    def source_rank(self) -> int:
        if self._source is None:
            raise RuntimeError("source_rank() is only defined for the Work of a recv from any source")
        self.wait()
        return self._source()

    _source_rank = source_rank


def completed_work(value: Any, device: Optional[torch.device] = None) -> dist.Work:
    """A torch Work over an already completed future holding ``value``."""
    future = new_future(device)
    future.set_result(value)
    return _create_work_from_future(future)
