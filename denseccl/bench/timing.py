"""Timing: the mean per-iteration time after warm-up, averaged across ranks (nccl-tests
``-a 1``), measured in rounds that alternate between contenders; the row reports the median
round, so that a noisy moment on a shared machine hits every contender alike."""

from __future__ import annotations

import statistics
import time
from typing import Dict, List, Sequence, Tuple

from .contenders import Run
from .job import Job


def time_once(job: Job, run: Run, iterations: int, warmup: int) -> float:
    """Seconds per iteration of ``run.step`` on this rank (device synchronised), averaged over
    ranks. A barrier lines the ranks up before the clock starts."""
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
    return job.mean(elapsed)


def rounds(job: Job, runs: Sequence[Tuple[str, Run]], iterations: int, warmup: int, count: int) -> Dict[str, List[float]]:
    """Per contender, the cross-rank mean seconds per iteration of each round. Round ``k``
    starts with contender ``k mod len(runs)`` so that no contender always goes first."""
    found: Dict[str, List[float]] = {name: [] for name, _ in runs}
    for k in range(count):
        for i in range(len(runs)):
            name, run = runs[(k + i) % len(runs)]
            found[name].append(time_once(job, run, iterations, warmup))
    return found


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")
