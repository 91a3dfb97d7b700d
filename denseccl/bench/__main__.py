"""``python -m denseccl.bench``: the nccl-tests-style benchmark (docs/benchmark.md), under mpiexec::

    launch/run -n 2 python -m denseccl.bench -b 4K -e 64M -f 4 --collective allreduce
"""

from __future__ import annotations

import json
import os
import sys
import time
import warnings
from typing import Any, List, Optional, Sequence, Tuple

from . import conventions as cv
from . import meta, options


def _gpu_problem() -> Optional[str]:
    """Why this machine cannot run the GPU benchmark, or None."""
    try:
        import cupy  # noqa: PLC0415
    except ImportError as error:
        return f"CuPy is not installed ({error}; pip install 'denseccl[cuda12]')"
    try:
        if not cupy.is_available():
            return "no CUDA GPU is visible (cupy.is_available() is False)"
    except Exception as error:  # noqa: BLE001
        return f"CUDA is not usable ({error})"
    return None


def _waits_line(world: Any) -> str:
    """How denseccl waits on this run's hosts (docs/performance-pinning.md). Collective over
    ``world``: the ranks of each host compare their CPUs and cgroup quotas."""
    from ..wait import WAITING  # noqa: PLC0415
    from ..backends.mpi.control import MPIControl  # noqa: PLC0415
    from ..channel.cores import local_placement  # noqa: PLC0415
    from ..channel.hosts import exchange_about  # noqa: PLC0415

    layout = exchange_about(MPIControl(world), None)
    crowded = layout.crowded[layout.mine]
    WAITING.note(crowded)
    limit = local_placement().limit
    quota = f"; rank 0's cgroup quota {limit:g} cores" if limit is not None else ""
    how = "poll briefly, then yield"
    if WAITING.crowded:
        how = "yield, then sleep on doorbells" if WAITING.doorbells is not None else "yield at once"
    shared = "the ranks of a host share cores" if crowded else "a core per rank"
    return f"#  waits: {shared}{quota}: {how}"


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = options.parser().parse_args(argv)
    try:
        plan = options.plan(args)
    except ValueError as error:
        print(f"denseccl.bench: {error}", file=sys.stderr)
        return 2
    pin_problem = meta.pin(plan.pin)  # before MPI and torch start threads, which inherit the mask
    # Library warnings (a missing kernel, a deprecation) would land between the table's rows:
    # they are collected and printed after the footer instead.
    with warnings.catch_warnings(record=True) as caught:
        status = _run(args, plan, pin_problem)
    seen = set()
    for warning in caught:
        text = f"{warning.category.__name__}: {warning.message}"
        if text not in seen:
            seen.add(text)
            where = f"{warning.filename}:{warning.lineno}"
            print(f"denseccl.bench: warning during the run ({where}): {text}", file=sys.stderr)
    return status


def _run(args: Any, plan: options.Plan, pin_problem: Optional[str]) -> int:
    from .job import Job  # noqa: PLC0415 - imports mpi4py
    from .plot import problem as plot_problem  # noqa: PLC0415
    from .heartbeat import Progress  # noqa: PLC0415
    from .runner import run_all  # noqa: PLC0415
    from .table import collective_title, footer, format_row, header  # noqa: PLC0415

    job = Job(args.backend)
    lead = job.rank == 0
    # Problems that only some ranks may see end the run on every rank, with one message.
    problems = [f"rank {rank}: --pin: {text}" for rank, text in enumerate(job.world.allgather(pin_problem)) if text]
    if not 0 <= args.root < job.size:
        problems.append(f"root {args.root} is not a rank (0..{job.size - 1})")
    if args.plot:
        missing = job.world.bcast(plot_problem() if lead else None, root=0)
        if missing:
            problems.append(f"{missing}; nothing was run")
    known: Tuple[str, ...]
    if args.backend == "mpi":
        from .contenders import HOST_CONTENDERS, host_contenders  # noqa: PLC0415

        known, make = HOST_CONTENDERS, host_contenders
    else:
        from .gpu import DEVICE_CONTENDERS, device_contenders  # noqa: PLC0415

        known, make = DEVICE_CONTENDERS, device_contenders
        gpu = _gpu_problem()
        if gpu is not None:
            problems.append(f"--backend nccl needs a GPU: {gpu}; use --backend mpi for host arrays")
    try:
        names = cv.expand(args.contenders, known, str.lower)
    except ValueError as error:
        problems.append(f"--contenders: {error}")
    if problems:
        if lead:
            for text in problems:
                print(f"denseccl.bench: {text}", file=sys.stderr)
        job.close()
        return 2
    try:
        import torch  # noqa: PLC0415

        torch.set_num_threads(max(args.torch_threads, 1))
    except ImportError:
        pass
    notes: List[str] = []
    contenders = make(job, names, plan.agreement, notes, plan.recorder)
    info = meta.gather(job.world)
    found_versions = meta.version_info() if lead else {}
    progress = Progress(args.progress if lead else 0)

    def say(*lines: str) -> None:
        if lead and lines:
            progress.printed()
            print(*lines, sep="\n", flush=True)

    say("# denseccl.bench: nccl-tests-style collectives on dense layouts")
    say(f"#  nranks {job.size}  backend {args.backend}  agreement {args.agreement}  iters {args.iters}"
        f"  warmup_iters {args.warmup_iters}  check {args.check}"
        f"  average {args.average} ({options.AVERAGES[args.average]})"
        f"  rounds {args.rounds} (median round; contenders alternate)")
    say(*meta.header_lines(info, found_versions, plan.pin))
    say(f"#  sizes {plan.sizes[0]}..{plan.sizes[-1]} B ({len(plan.sizes)})  layouts {','.join(plan.layouts)}"
        f"  contenders {','.join(c.name for c in contenders)}")
    say("#  time: per-iteration time after warm-up, combined across ranks by -a; GB = 1e9 B; all calls in place")
    say("#  (allgather and reduce_scatter write a separate output); count is per rank for allgather/reduce_scatter")
    say(f"#  memory: {args.memory} (shared: the contenders and layouts of one size run on the same buffers)")
    say(*(f"#  skipped contender: {note}" for note in notes))
    say(_waits_line(job.world))

    def emit(kind: str, payload: Any) -> None:
        if kind == "block":
            say(collective_title(*payload), *header(args.memcheck))
        else:
            say(format_row(payload, args.memcheck))

    started = time.perf_counter()
    rows = run_all(job, contenders, plan, progress, emit)
    say(*footer(rows))
    failed = any(row.get("denseccl") and (row.get("error") or row.get("wrong")) for row in rows)
    if lead:
        if args.json:
            described = {
                "nranks": job.size, "backend": args.backend, "agreement": args.agreement, "check": args.check,
                "iters": args.iters, "warmup": args.warmup_iters, "rounds": args.rounds,
                "seconds": time.perf_counter() - started, "host": os.uname().nodename, "skipped": notes,
                "versions": found_versions, "settings": options.described(args), **info,
            }
            with open(args.json, "w") as handle:
                json.dump({"meta": described, "rows": rows}, handle, indent=1, default=str)
        if args.plot:
            from .plot import PlotUnavailable, plot  # noqa: PLC0415

            try:
                plot(rows, args.plot, f"denseccl.bench, {job.size} ranks, backend {args.backend}", nranks=job.size,
                     logy=args.logy)
            except PlotUnavailable as error:
                print(f"denseccl.bench: {error}", file=sys.stderr)
    job.close()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
