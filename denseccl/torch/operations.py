"""How the process group's methods read torch's arguments and start their operations.

Each operation builds an *issue*, a function that starts its steps and returns them with the
*finish* that produces its result (see :mod:`.progress`).

Two rules hold for every issue, and live here so that each collective need not repeat them:
a local failure (bad arguments, a layout refused) is raised on every rank, through denseccl's
agreement step, instead of leaving the peers waiting; and when one of several steps fails to
start, the ones already started (which the peers started too) are waited for before raising.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, ContextManager, Iterator, List, Optional, Sequence, Tuple

import torch

from .. import config
from ..communicator import Communicator
from ._tensors import land


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


def cuda_context(device: Optional[torch.device]) -> ContextManager[Any]:
    """For CUDA tensors, make their device current (denseccl runs a torch tensor's device
    collective on torch's current stream of that device)."""
    if device is None or device.type != "cuda":
        return contextlib.nullcontext()
    return torch.cuda.device(device)


Issue = Callable[[], Tuple[List[Any], Callable[[], Any]]]


@contextlib.contextmanager
def raising_everywhere(comm: Communicator, collective: str) -> Iterator[None]:
    """Local checks and staging of ``collective``: an exception they raise is raised on every
    rank, after this rank took part in the agreement step as invalid (``Flow.fail``)."""
    try:
        yield
    except Exception as error:  # noqa: BLE001 - Flow.fail raises it
        comm.flow.fail(collective, error)


def _settle(steps: Sequence[Any]) -> None:
    """Wait for steps already started (their peers started them too), ignoring their errors:
    a later step failed to start, and that is the error to raise."""
    for step in steps:
        with contextlib.suppress(Exception):
            step.wait()


def start_each(starts: Sequence[Callable[[], Any]]) -> List[Any]:
    """Start several collectives; if one fails, finish the ones already started before
    raising."""
    started: List[Any] = []
    try:
        for start in starts:
            started.append(start())
    except BaseException:
        _settle(started)
        raise
    return started


def chain(issues: Sequence[Issue], outputs: List[torch.Tensor]) -> Issue:
    """Several single-tensor issues as one operation."""

    def issue() -> Tuple[List[Any], Callable[[], Any]]:
        steps: List[Any] = []
        finishes: List[Callable[[], Any]] = []
        try:
            for one in issues:
                more, then = one()
                steps.extend(more)
                finishes.append(then)
        except BaseException:
            _settle(steps)
            raise

        def finish() -> List[torch.Tensor]:
            for one in finishes:
                one()
            return outputs

        return steps, finish

    return issue


def one_step(
    work: Any, output: torch.Tensor, copy_into: Optional[torch.Tensor] = None
) -> Tuple[List[Any], Callable[[], Any]]:
    """The steps and finish of a single-tensor operation whose result is ``output``: the work
    moved it there, or (staged) the finish copies the work's result into ``copy_into``
    (``output`` or a view of it)."""

    def finish() -> List[torch.Tensor]:
        if copy_into is not None:
            land(copy_into, work.result)
        return [output]

    return [work], finish
