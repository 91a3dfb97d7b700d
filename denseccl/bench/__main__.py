"""``python -m denseccl.bench``: the nccl-tests-style benchmark. Run it under mpiexec:

    launch/run -n 2 python -m denseccl.bench -b 4K -e 64M -f 4 -c allreduce --layouts all

Options follow nccl-tests (``-b -e -f -i -d -o -c -n -w -r``); see ``--help``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, List, Optional, Sequence

from . import conventions as cv


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m denseccl.bench",
        description="nccl-tests-style benchmark of denseccl against raw MPI/NCCL, the copy-to-contiguous "
        "path and torch.distributed, on contiguous and non-contiguous dense layouts. Run under mpiexec "
        "(launch/run -n N python -m denseccl.bench ...).",
    )
    p.add_argument("-b", "--minbytes", default="4K", help="smallest size in bytes (K/M/G suffixes; default 4K)")
    p.add_argument("-e", "--maxbytes", default="16M", help="largest size in bytes (default 16M)")
    p.add_argument("-f", "--stepfactor", type=float, default=4.0, help="multiply the size by this each step (default 4)")
    p.add_argument("-i", "--stepbytes", default="0", help="add this many bytes each step instead of -f")
    p.add_argument("-d", "--datatype", default="float", help="element type(s), comma separated, or all (default float)")
    p.add_argument("-o", "--op", default="sum", help="reduction op(s): sum, prod, min, max, avg, comma separated, or all")
    p.add_argument("-c", "--collective", default="allreduce",
                   help="allreduce, reduce, broadcast, allgather, reduce_scatter, comma separated, or all (default allreduce)")
    p.add_argument("-n", "--iters", type=int, default=20, help="timed iterations per round (default 20)")
    p.add_argument("-w", "--warmup_iters", type=int, default=1, help="warm-up iterations before each round (default 1)")
    p.add_argument("-r", "--root", type=int, default=0, help="root rank of reduce and broadcast (default 0)")
    p.add_argument("--rounds", type=int, default=3, help="rounds alternating between contenders; rows report the median (default 3)")
    p.add_argument("--layouts", default="contiguous,channels_last,transposed,reversed",
                   help="array layouts: contiguous, channels_last, transposed, reversed, comma separated, or all")
    p.add_argument("--check", default="on", help="denseccl's cross-rank agreement check: on, off, or on,off for both")
    p.add_argument("--backend", default="mpi", choices=("mpi", "nccl"), help="mpi: host arrays; nccl: GPU arrays")
    p.add_argument("--contenders", default="all", help="comma separated subset of the backend's contenders, or all")
    p.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    p.add_argument("--plot", metavar="FILE.png", help="also plot busbw against size (needs matplotlib)")
    p.add_argument("--memcheck", action="store_true",
                   help="trace Python/NumPy allocations (tracemalloc) during each denseccl call; adds a 'peak tmp' column")
    p.add_argument("--memory", choices=("shared", "separate"), default="shared",
                   help="shared (default): every contender and layout of a size uses the same memory, so comparisons "
                   "do not depend on where the allocator put each array; separate: each run allocates its own")
    p.add_argument("--torch-threads", type=int, default=1,
                   help="torch intra-op threads per rank (default 1: one rank per core)")
    return p


def _checks(text: str) -> List[bool]:
    words = {"on": True, "always": True, "off": False}
    found: List[bool] = []
    for word in text.split(","):
        word = word.strip().lower()
        if word not in words:
            raise ValueError(f"--check takes on, off or on,off; got {text!r}")
        if words[word] not in found:
            found.append(words[word])
    return found


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


def _cores_line(world: Any) -> str:
    """Where rank 0 runs and how denseccl waits there (docs/performance-pinning.md).
    Collective over ``world``: the ranks of each host compare their placements."""
    from ..transports.base import WAITING  # noqa: PLC0415
    from ..transports.cores import host_crowded, local_placement, usable_cores  # noqa: PLC0415

    crowded = host_crowded(world)
    here = local_placement()
    quota = f", cgroup quota {here.limit:g} cores" if here.limit is not None else ""
    shared = "ranks of this host share cores" if crowded else "a core per rank"
    waits = "spin briefly, then yield"
    if WAITING.crowded:
        waits = "sleep on doorbells" if WAITING.doorbells is not None else "yield at once"
    return f"#  cores: rank 0 may use {usable_cores(here)} (affinity {sorted(here.cpus)}{quota}); {shared}: waits {waits}"


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parser().parse_args(argv)
    try:
        collectives = cv.expand(args.collective, cv.COLLECTIVES, cv.collective_name)
        dtypes = cv.expand(args.datatype, tuple(cv.TYPE_NAMES), cv.dtype_name)
        ops = cv.expand(args.op, cv.OPS, str.lower)
        layouts = cv.expand(args.layouts, cv.LAYOUTS, str.lower)
        sizes = cv.sizes(cv.parse_size(args.minbytes), cv.parse_size(args.maxbytes), args.stepfactor, cv.parse_size(args.stepbytes))
        checks = _checks(args.check)
    except ValueError as error:
        print(f"denseccl.bench: {error}", file=sys.stderr)
        return 2

    from .job import Job  # noqa: PLC0415 - imports mpi4py
    from .runner import Settings, run_all  # noqa: PLC0415
    from .table import collective_title, footer, format_row, header  # noqa: PLC0415

    job = Job(args.backend)
    if not 0 <= args.root < job.size:
        if job.rank == 0:
            print(f"denseccl.bench: root {args.root} is not a rank (0..{job.size - 1})", file=sys.stderr)
        return 2
    try:
        import torch  # noqa: PLC0415

        torch.set_num_threads(max(args.torch_threads, 1))
    except ImportError:
        pass
    notes: List[str] = []
    if args.backend == "mpi":
        from .contenders import HOST_CONTENDERS, host_contenders  # noqa: PLC0415

        known, make = HOST_CONTENDERS, host_contenders
    else:
        problem = _gpu_problem()
        if problem is not None:
            if job.rank == 0:
                print(f"denseccl.bench: --backend nccl needs a GPU: {problem}; use --backend mpi for host arrays", file=sys.stderr)
            return 2
        from .gpu import DEVICE_CONTENDERS, device_contenders  # noqa: PLC0415

        known, make = DEVICE_CONTENDERS, device_contenders
    try:
        names = cv.expand(args.contenders, known, str.lower)
    except ValueError as error:
        if job.rank == 0:
            print(f"denseccl.bench: --contenders: {error}", file=sys.stderr)
        return 2
    contenders = make(job, names, checks, notes)
    lead = job.rank == 0

    def say(line: str) -> None:
        if lead:
            print(line, flush=True)

    say("# denseccl.bench: nccl-tests-style collectives on dense layouts")
    say(f"#  nranks {job.size}  backend {args.backend}  check {args.check}  iters {args.iters}  warmup {args.warmup_iters}"
        f"  rounds {args.rounds} (median round; contenders alternate)")
    say(f"#  sizes {sizes[0]}..{sizes[-1]} B  layouts {','.join(layouts)}  contenders {','.join(c.name for c in contenders)}")
    say("#  time: mean per-iteration time after warm-up, averaged across ranks; GB = 1e9 B; all calls in place")
    say("#  (allgather and reduce_scatter write a separate output); count is per rank for allgather/reduce_scatter")
    say(f"#  memory: {args.memory} (shared: the contenders and layouts of one size run on the same buffers)")
    for note in notes:
        say(f"#  skipped contender: {note}")
    say(_cores_line(job.world))

    def emit(kind: str, payload: Any) -> None:
        if kind == "block":
            say(collective_title(*payload))
            for line in header(args.memcheck):
                say(line)
        else:
            say(format_row(payload, args.memcheck))

    started = time.perf_counter()
    rows = run_all(job, contenders, Settings(
        collectives=collectives, dtypes=dtypes, ops=ops, sizes=sizes, layouts=layouts, root=args.root,
        iterations=args.iters, warmup=args.warmup_iters, rounds=args.rounds, memcheck=args.memcheck,
        shared_memory=args.memory == "shared",
    ), cv.ITEMSIZES, emit)
    for line in footer(rows):
        say(line)
    failed = any(row.get("denseccl") and (row.get("error") or row.get("wrong")) for row in rows)
    if lead:
        if args.json:
            meta = {
                "nranks": job.size, "backend": args.backend, "check": args.check, "iters": args.iters,
                "warmup": args.warmup_iters, "rounds": args.rounds, "seconds": time.perf_counter() - started,
                "host": os.uname().nodename, "skipped": notes,
            }
            with open(args.json, "w") as handle:
                json.dump({"meta": meta, "rows": rows}, handle, indent=1, default=str)
        if args.plot:
            from .plot import PlotUnavailable, plot  # noqa: PLC0415

            try:
                plot(rows, args.plot, f"denseccl.bench, {job.size} ranks, backend {args.backend}")
            except PlotUnavailable as error:
                print(f"denseccl.bench: {error}", file=sys.stderr)
    job.close()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
