"""``python -m denseccl.bench.agreement_step``: the agreement step alone, per call, on every control
channel that can run in this job, side by side (docs/benchmark.md, "The agreement step")::

    mpiexec -n 4 python -m denseccl.bench.agreement_step [--rounds 9] [--iters 2000]
    torchrun --standalone --nproc-per-node 4 -m denseccl.bench.agreement_step

Contenders, all over the same ranks: ``board`` (the shared-memory board set up over a store,
denseccl/channel/; across hosts a board per host plus one leaders' round), ``leaders`` (that
leaders' round alone, timed on the leaders: what the board adds to it across hosts), ``gloo``
(a gloo allreduce on a group of its own: the gloo engine's channel without boards), ``store``
(set, wait, multi_get, delete through the store: the NCCL path's channel without boards), and
under mpiexec ``mpi-board`` (the board of an MPI launch) and ``mpi-allreduce`` (an MPI
allreduce on the control communicator). A round is a barrier, then ``iters`` agreement steps on
one contender (the mean per step, averaged over ranks); contenders alternate round by round and
the table shows the median of the rounds in microseconds, with the range.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import time
from datetime import timedelta
from typing import Any, Callable, Dict, List, Optional, Tuple

from ..channel.base import ControlChannel
from ..backends.store import StoreControl, gloo_leaders
from ..channel.shared import SharedControl, open_shared
from ..config import launched_by_mpi
from ..wait import WAITING

#: a contender: ``(calls, deadline)``, the timed steps of one round on this rank (None: none here)
Round = Callable[[int, float], None]


def _steps(control: ControlChannel) -> Round:
    all_equal = control.all_equal

    def run(calls: int, deadline: float) -> None:
        for value in range(calls):
            all_equal(value, False, deadline)

    return run


def _store(rank: int, size: int, mpi: Any) -> Any:
    """The job's TCPStore: served by rank 0 on a free port told over MPI, or torchrun's."""
    from torch.distributed import TCPStore  # noqa: PLC0415

    if mpi is None:
        from ..backends.rendezvous import env_store  # noqa: PLC0415

        return env_store(rank, size, 60)
    server = TCPStore(socket.gethostname(), 0, size, True, timeout=timedelta(seconds=60), wait_for_workers=False) \
        if rank == 0 else None
    host_port = mpi.COMM_WORLD.bcast((socket.gethostname(), server.port) if server else None, root=0)
    if server is not None:
        return server
    return TCPStore(host_port[0], host_port[1], size, False, timeout=timedelta(seconds=60))


def contenders(rank: int, size: int) -> Tuple[Dict[str, Optional[Round]], ControlChannel]:
    """Every contender this job can run (collective: every rank builds them in one order), and
    a gloo channel for the barriers and the results."""
    from ..backends.gloo.transport import GlooControl, make_group  # noqa: PLC0415

    mpi = None
    if launched_by_mpi():
        from mpi4py import MPI  # noqa: PLC0415

        mpi = MPI
    store = _store(rank, size, mpi)
    deadline = time.monotonic() + 120
    found: Dict[str, Optional[Round]] = {}
    board = open_shared(StoreControl(store, rank, size, "agreement-bench/board"), deadline, gloo_leaders)
    if isinstance(board, SharedControl):
        found["board"] = _steps(board)
        if len(board.layout.hosts) > 1:
            found["leaders"] = _steps(board.leaders) if board.leaders is not None else None
    gloo = GlooControl(make_group(store, "agreement-bench/gloo/", rank, size, 120, "bench", deadline), store,
                       "agreement-bench/gloo/", 120)
    found["gloo"] = _steps(gloo)
    found["store"] = _steps(StoreControl(store, rank, size, "agreement-bench/store"))
    if mpi is not None:
        from ..backends.mpi.control import MPIControl, open_control  # noqa: PLC0415

        shared = open_control(mpi.COMM_WORLD.Dup())
        if shared.board is not None:
            found["mpi-board"] = _steps(shared)
        found["mpi-allreduce"] = _steps(MPIControl(mpi.COMM_WORLD.Dup()))
    return found, GlooControl(make_group(store, "agreement-bench/sync/", rank, size, 120, "bench", deadline), store,
                              "agreement-bench/sync/", 120)


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--iters", type=int, default=2000, help="agreement steps per round (store: a tenth)")
    parser.add_argument("--json", help="write the medians here (rank 0)")
    args = parser.parse_args(argv)
    if launched_by_mpi():
        from mpi4py import MPI  # noqa: PLC0415

        rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    else:
        rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    found, sync = contenders(rank, size)
    names = list(found)
    times: Dict[str, List[float]] = {name: [] for name in names}
    for k in range(args.rounds):
        for i in range(len(names)):
            name = names[(k + i) % len(names)]
            run = found[name]
            calls = max(args.iters // (10 if name == "store" else 1), 1)
            sync.all_equal(0, False, time.monotonic() + 120)  # a barrier
            started = time.perf_counter()
            if run is not None:
                run(calls, time.monotonic() + 120)
            times[name].append((time.perf_counter() - started) / calls if run is not None else float("nan"))
    every = [json.loads(raw) for raw in sync.allgather_bytes(json.dumps(times).encode(), time.monotonic() + 120)]
    if rank == 0:
        rows = {name: _summary([[entry[name][k] for entry in every] for k in range(args.rounds)]) for name in names}
        crowded = "waits yield and sleep (crowded or across hosts)" if WAITING.crowded else "waits spin first"
        print(f"# agreement step per call, {size} ranks, {crowded}; median of {args.rounds} alternating rounds "
              f"(us, mean over the ranks that take part), range; under mpiexec: {launched_by_mpi()}")
        for name, (median, low, high) in rows.items():
            print(f"  {name:14s} {median:10.2f}   {low:.2f}-{high:.2f}")
        if args.json:
            with open(args.json, "w") as handle:
                json.dump({"ranks": size, "crowded": WAITING.crowded, "rows": rows}, handle)


def _summary(rounds: List[List[float]]) -> Tuple[float, float, float]:
    """(median, min, max) over rounds of the mean over the ranks that ran (NaN: did not), in us."""
    means = [statistics.mean([v for v in values if v == v]) * 1e6 for values in rounds]
    return statistics.median(means), min(means), max(means)


if __name__ == "__main__":
    main()
