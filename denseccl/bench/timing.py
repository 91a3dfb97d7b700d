"""Timing: the mean per-iteration time after warm-up, combined across ranks as nccl-tests'
``-a`` says (default 1: the mean), measured in rounds that alternate between contenders; the
row reports the median round, so that a noisy moment on a shared machine hits every contender
alike."""

from __future__ import annotations

import time
from typing import Callable, Dict, Hashable, List, Sequence, Tuple, TypeVar

from .contenders import Run
from .job import Job


def combine(job: Job, seconds: float, average: int = 1) -> float:
    """One rank's seconds -> the job's, as nccl-tests' ``-a``: 0 rank 0's, 1 the mean over
    ranks, 2 the minimum, 3 the maximum."""
    if average == 0:
        return float(job.world.bcast(float(seconds), root=0))
    if average == 1:
        return float(job.world.allreduce(float(seconds))) / job.size
    return float(job.world.allreduce(float(seconds), op=job.MPI.MIN if average == 2 else job.MPI.MAX))


def time_once(job: Job, run: Run, iterations: int, warmup: int, average: int = 1) -> float:
    """Seconds per iteration of ``run.step`` on this rank (device synchronised), combined over
    ranks by :func:`combine`. A barrier lines the ranks up before the clock starts."""
    step = run.step
    for _ in range(warmup):
        step()
    run.sync()
    job.world.Barrier()
    start = time.perf_counter()
    for _ in range(iterations):
        step()
    run.sync()
    elapsed = (time.perf_counter() - start) / max(iterations, 1)
    return combine(job, elapsed, average)


Key = TypeVar("Key", bound=Hashable)


def rounds(job: Job, runs: Sequence[Tuple[Key, Run]], iterations: int, warmup: int, count: int, average: int,
           tick: Callable[[str], None]) -> Dict[Key, List[float]]:
    """Per contender, the seconds per iteration of each round (combined over ranks). Round ``k``
    starts with contender ``k mod len(runs)`` so that no contender always goes first. ``tick``
    hears where the timing is (for progress lines)."""
    found: Dict[Key, List[float]] = {name: [] for name, _ in runs}
    for k in range(count):
        for i in range(len(runs)):
            name, run = runs[(k + i) % len(runs)]
            tick(f"timing round {k + 1}/{count}, run {i + 1}/{len(runs)}")
            found[name].append(time_once(job, run, iterations, warmup, average))
    return found
