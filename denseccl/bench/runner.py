"""The benchmark loop: for every collective, type, op, size and layout, check each contender on
deterministic inputs (``#wrong``; ``-c`` times, or one unchecked call with ``-c 0``), then time
them in alternating rounds."""

from __future__ import annotations

import statistics
import tracemalloc
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from . import cases
from .cases import Case
from .contenders import Contender, Run
from .conventions import ITEMSIZES, NCCL_TESTS_NAMES, REDUCING, ROOTED, bandwidths, count_for, size_of
from .job import Job
from .libs import Unsupported
from .options import Plan
from .heartbeat import Progress
from .timing import rounds

Row = Dict[str, Any]


def verify(job: Job, case: Case, run: Run, memcheck: bool, check: int = 1) -> Tuple[Optional[int], Optional[int]]:
    """Run ``check`` times on deterministic inputs, stopping at the first wrong result (as
    nccl-tests' ``-c``); return (#wrong on this rank, peak bytes traced by tracemalloc during
    the first call when ``memcheck``). With ``check`` 0 the inputs are zeros and the one call
    only has to succeed: #wrong is None."""
    wrong, peak = _verify_once(job, case, run, memcheck, check > 0)
    for _ in range(1, check):
        if wrong:
            break
        wrong = _verify_once(job, case, run, False, True)[0]
    return wrong, peak


def _verify_once(job: Job, case: Case, run: Run, memcheck: bool, compare: bool) -> Tuple[Optional[int], Optional[int]]:
    run.load(cases.source_values(case) if compare else None)
    run.sync()
    job.world.Barrier()
    if memcheck:
        tracemalloc.start()
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
    run.step()
    run.sync()
    peak = None
    if memcheck:
        peak = tracemalloc.get_traced_memory()[1] - base
        tracemalloc.stop()
    if not compare:
        return None, peak
    if case.collective == "reduce" and job.rank != case.root and not run.keep_non_root:
        return 0, peak
    return cases.count_wrong(case, run.result(), cases.expected(case)), peak


def _error_text(error: BaseException) -> str:
    return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:200]


def _key(row: Row) -> Tuple[str, str, str]:
    return (row["type"], row["layout"], row["contender"])


def run_group(job: Job, group: Sequence[Case], contenders: Sequence[Contender], plan: Plan,
              progress: Progress) -> List[Row]:
    """Rows for cases that differ only in element type and layout (one collective, op and
    size): every contender is verified on every case, then all of them are timed together in
    alternating rounds, so that any two rows of the group can be compared round by round."""
    rows: List[Row] = []
    timed: List[Tuple[Tuple[str, str, str], Run]] = []
    arena = cases.Arena() if plan.shared_memory else None
    for number, case in enumerate(group):
        size = size_of(case.collective, case.count, ITEMSIZES[case.dtype], case.nranks)
        base = {
            "collective": case.collective, "size": size, "count": case.count, "type": case.dtype,
            "redop": case.op if case.collective in REDUCING else None,
            "root": case.root if case.collective in ROOTED else -1, "layout": case.layout,
        }
        for contender in contenders:
            if contender.skip(case) is not None:
                continue
            row: Row = dict(base, contender=contender.name, denseccl=contender.denseccl)
            error: Optional[str] = None
            progress.at(f"checking case {number + 1}/{len(group)}, {contender.name}")
            try:
                run = contender.prepare(case, arena)
                wrong, peak = verify(job, case, run, plan.memcheck and contender.denseccl, plan.check)
            except Unsupported as reason:
                error = f"unsupported: {reason}"
            except Exception as failure:  # noqa: BLE001 - reported in the row, on every rank
                error = _error_text(failure)
            if job.any(error is not None):
                messages = [m for m in job.world.allgather(error) if m]
                if all(m.startswith("unsupported") for m in messages):
                    continue
                row.update(error=messages[0], wrong=None, time_us=float("nan"), algbw=float("nan"), busbw=float("nan"))
                rows.append(row)
                continue
            row["wrong"] = None if plan.check == 0 else int(job.world.allreduce(int(wrong or 0)))
            if plan.memcheck and contender.denseccl:
                row["peak_bytes"] = int(job.world.allreduce(int(peak or 0), op=job.MPI.MAX))
            run.load(None)  # every rank prepared it: no rank had an error
            timed.append((_key(row), run))
            rows.append(row)
    if timed:
        times = rounds(job, timed, plan.iterations, plan.warmup, plan.rounds, plan.average, progress.at)
        for row in rows:
            if row.get("error"):
                continue
            measured = times[_key(row)]
            seconds = statistics.median(measured)
            algbw, busbw = bandwidths(row["collective"], row["size"], seconds, job.size)
            row.update(time_us=seconds * 1e6, algbw=algbw, busbw=busbw, rounds_us=[t * 1e6 for t in measured])
    return rows


def run_all(job: Job, contenders: Sequence[Contender], plan: Plan, progress: Progress,
            emit: Callable[[str, Any], None]) -> List[Row]:
    """The whole benchmark; ``emit(kind, payload)`` is called as results come in
    (``"block"`` with (collective, op) before a block, ``"row"`` with each row). The element
    types and layouts of one size are timed together (see :func:`run_group`)."""
    rows: List[Row] = []
    for collective in plan.collectives:
        ops: Sequence[Optional[str]] = plan.ops if collective in REDUCING else (None,)
        for op in ops:
            emit("block", (collective, op))
            for number, size in enumerate(plan.sizes):
                progress.enter(f"{NCCL_TESTS_NAMES[collective]} {op or ''} {size} B (size {number + 1}/"
                               f"{len(plan.sizes)})".replace("  ", " "))
                group: List[Case] = []
                for dtype in plan.dtypes:
                    count = count_for(collective, size, ITEMSIZES[dtype], job.size)
                    if count:
                        group.extend(Case(collective, dtype, op, plan.root, count, layout, job.size, job.rank)
                                     for layout in plan.layouts)
                for row in run_group(job, group, contenders, plan, progress):
                    rows.append(row)
                    emit("row", row)
    return rows
