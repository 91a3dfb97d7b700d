"""The benchmark's command line, parsed and checked before any rank talks to another.

Where nccl-tests has a flag (``src/common.cu``), it means the same here and has the same default;
the collective, which nccl-tests selects by binary, is ``--collective``; denseccl's own settings
have long names only. nccl-tests flags without a meaning here are refused rather than reused.
docs/benchmark.md (Flags) lists every flag.
"""

from __future__ import annotations

import argparse
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Set

from . import conventions as cv

#: nccl-tests' -a: how the ranks' times are combined
AVERAGES = {0: "rank 0", 1: "mean", 2: "min", 3: "max"}


class Plan(NamedTuple):
    """What the command line asks for, with every list expanded and checked."""

    collectives: List[str]
    dtypes: List[str]
    ops: List[str]
    layouts: List[str]
    sizes: List[int]
    agreement: List[bool]
    recorder: List[bool]
    pin: Optional[str]
    root: int
    iterations: int
    warmup: int
    rounds: int
    memcheck: bool
    #: --memory shared: the runs of one size share their memory (cases.Arena)
    shared_memory: bool
    #: nccl-tests' -c: check iterations per case (0: one unchecked call, #wrong N/A)
    check: int
    #: nccl-tests' -a: how the ranks' times combine (:data:`AVERAGES`)
    average: int


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m denseccl.bench",
        description="nccl-tests-style benchmark of denseccl against raw MPI/NCCL, the copy-to-contiguous path "
        "and torch.distributed, on contiguous and non-contiguous dense layouts. Run it under mpiexec "
        "(launch/run -n N python -m denseccl.bench ...). Flags that nccl-tests has mean what they mean there.",
    )
    nccl_tests = p.add_argument_group("nccl-tests flags")
    add = nccl_tests.add_argument
    add("-b", "--minbytes", default="32M", help="smallest size in bytes: 4096, 4K, 1.5M, 1G (default 32M)")
    add("-e", "--maxbytes", default="32M", help="largest size in bytes (default 32M)")
    add("-f", "--stepfactor", type=float, default=1.0,
        help="multiply the size by this each step; > 1 wins over -i (default 1: use -i)")
    add("-i", "--stepbytes", default="1M", help="add this many bytes each step when -f is 1 (default 1M)")
    add("-n", "--iters", type=int, default=20, help="timed iterations per round (default 20)")
    add("-w", "--warmup_iters", type=int, default=5, help="warm-up iterations before each round (default 5)")
    add("-c", "--check", type=_check_count, default=1,
        help="check iterations: run each case this many times on known inputs and count wrong elements "
        "in #wrong; 0 skips the check (#wrong N/A) (default 1)")
    add("-o", "--op", default="sum", help="reduction op(s): sum, prod, min, max, avg, comma separated, or all")
    add("-d", "--datatype", default="float",
        help="element type(s): float, half, bfloat16, double, int8, uint8, int32, uint32, int64, uint64 "
        "(or NumPy names), comma separated, or all (default float)")
    add("-r", "--root", type=int, default=0, help="root rank of reduce and broadcast (default 0)")
    add("-a", "--average", type=int, default=1, choices=sorted(AVERAGES),
        help="time reported across ranks: 0 rank 0's, 1 the mean, 2 the min, 3 the max (default 1)")
    add = p.add_argument_group("denseccl flags").add_argument
    add("--collective", default="allreduce",
        help="allreduce, reduce, broadcast, allgather, reduce_scatter (or nccl-tests' all_reduce ...), "
        "comma separated, or all (default allreduce)")
    add("--layouts", default="all",
        help="array layouts: contiguous, channels_last, transposed, reversed, comma separated, or all (default all)")
    add("--agreement", default="on",
        help="denseccl's cross-rank agreement check: on, off, or on,off for both (contenders denseccl and "
        "denseccl-nocheck)")
    add("--recorder", default="off",
        help="denseccl's flight recorder (DENSECCL_TRACE_BUFFER, else 1024 calls): off (default), on, or off,on "
        "for both in one run (the contenders with it are named ...-recorder; host backend)")
    add("--backend", default="mpi", choices=("mpi", "nccl"), help="mpi: host arrays; nccl: GPU arrays")
    add("--contenders", default="all", help="comma separated subset of the backend's contenders, or all")
    add("--rounds", type=int, default=3,
        help="rounds alternating between contenders; rows report the median (default 3)")
    add("--json", metavar="FILE", help="also write the rows and the run's metadata as JSON")
    add("--plot", metavar="FILE.png", help="also plot busbw against size (needs matplotlib)")
    add("--logy", action="store_true", help="with --plot: a logarithmic busbw axis")
    add("--pin", metavar="CPUS",
        help="pin every rank before MPI starts: a CPU list as taskset -c takes it (0, 0-3, 0,2), every rank "
        "on those CPUs; or 'core', each rank on its own CPU (local rank r on the r-th usable CPU)")
    add("--progress", type=float, default=10.0, metavar="SECONDS",
        help="say on stderr where a long run is when nothing was printed for this long (0: never; default 10)")
    add("--memcheck", action="store_true",
        help="trace Python/NumPy allocations (tracemalloc) during each denseccl call; adds a 'peak tmp' column")
    add("--memory", choices=("shared", "separate"), default="shared",
        help="shared (default): every contender and layout of a size uses the same memory, so comparisons "
        "do not depend on where the allocator put each array; separate: each run allocates its own")
    add("--torch-threads", type=int, default=1, help="torch intra-op threads per rank (default 1: one rank per core)")
    return p


def _check_count(text: str) -> int:
    try:
        return int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"-c is nccl-tests' --check (a number of check iterations, 0 = none), got {text!r}; "
            "the collective is chosen with --collective (e.g. --collective all)"
        ) from None


def agreement(text: str, option: str = "--agreement") -> List[bool]:
    """``on``, ``off`` or ``on,off`` -> the settings of ``option`` to run, in order."""
    words = {"on": True, "always": True, "off": False}
    found: List[bool] = []
    for word in text.split(","):
        word = word.strip().lower()
        if word not in words:
            raise ValueError(f"{option} takes on, off or on,off; got {text!r}")
        if words[word] not in found:
            found.append(words[word])
    return found


def pin_cpus(spec: str, usable: Sequence[int], local_rank: int) -> Set[int]:
    """The CPUs ``--pin spec`` gives this rank. ``core``: the ``local_rank``-th of ``usable``
    (wrapping around); otherwise a taskset-style list (``0``, ``0-3``, ``0,2``) for every rank."""
    if spec.strip().lower() == "core":
        return {sorted(usable)[local_rank % len(usable)]}
    found: Set[int] = set()
    for part in spec.split(","):
        first, dash, last = part.strip().partition("-")
        if not first.isdigit() or (dash and not last.isdigit()):
            raise ValueError(f"--pin takes 'core' or a CPU list such as 0, 0-3 or 0,2; got {spec!r}")
        found.update(range(int(first), int(last if dash else first) + 1))
    missing = sorted(found - set(usable))
    if missing:
        raise ValueError(f"--pin {spec}: CPU(s) {missing} are not usable by this process (usable: {sorted(usable)})")
    return found


def plan(args: argparse.Namespace) -> Plan:
    """Check and expand the parsed arguments; ValueError names what is wrong."""
    if args.check < 0:
        raise ValueError(f"-c/--check takes a number of check iterations (0 = none), got {args.check}")
    if args.iters < 1 or args.warmup_iters < 0 or args.rounds < 1:
        raise ValueError("-n and --rounds must be >= 1 and -w >= 0")
    return Plan(
        collectives=cv.expand(args.collective, cv.COLLECTIVES, cv.collective_name),
        dtypes=cv.expand(args.datatype, tuple(cv.TYPE_NAMES), cv.dtype_name),
        ops=cv.expand(args.op, cv.OPS, str.lower),
        layouts=cv.expand(args.layouts, cv.LAYOUTS, str.lower),
        sizes=cv.sizes(cv.parse_size(args.minbytes), cv.parse_size(args.maxbytes), args.stepfactor,
                       cv.parse_size(args.stepbytes)),
        agreement=agreement(args.agreement),
        recorder=agreement(args.recorder, "--recorder"),
        pin=args.pin, root=args.root, iterations=args.iters, warmup=args.warmup_iters, rounds=args.rounds,
        memcheck=args.memcheck, shared_memory=args.memory == "shared", check=args.check, average=args.average,
    )


#: the settings the JSON's metadata records, by their nccl-tests names
DESCRIBED = ("minbytes", "maxbytes", "stepfactor", "stepbytes", "iters", "warmup_iters", "check", "average", "op",
             "datatype", "root", "collective", "layouts", "agreement", "recorder", "backend", "contenders", "rounds",
             "memory", "pin")


def described(args: argparse.Namespace) -> Dict[str, Any]:
    """The settings as the JSON's metadata records them (:data:`DESCRIBED`)."""
    return {name: getattr(args, name) for name in DESCRIBED}
