"""Rank program: faults the flight recorder must explain (tests/mpi/test_recorder.py reads the
dumps with ``python -m denseccl.trace_summary``). Every rank checks its results against NumPy
over all ranks' inputs, and that its dump was written.

Scenarios (3 ranks, ``DENSECCL_TRACE_DIR`` set by the test):

- ``skip``: rank 2 skips the third of five allreduces; ranks 0 and 1 time out in the fifth (a
  timeout dumps), rank 2 waits until its communicator says a peer gave up (which dumps).
- ``stop``: rank 1 stops itself (SIGSTOP) before the fourth allreduce; ranks 0 and 2 time out
  there and dump; rank 0 then kills rank 1, which writes nothing.
- ``mismatch``: rank 1 passes a transposed array to the third allreduce: MismatchError on every
  rank; each rank dumps on request (``comm.dump_trace``).

usage: mpiexec -n 3 python recorder.py SCENARIO TIMEOUT
"""

from __future__ import annotations

import os
import signal
import sys
import time

import numpy as np

import denseccl
from tests.support.checker import Checker

SHAPE = (4, 6)
CALLS = 5
#: the call (in the program's order) that the scenario changes on its rank
SKIPPED, STOPPED, MISMATCHED = 2, 3, 2


def inputs(rank: int, call: int) -> np.ndarray:
    return np.random.default_rng([call, rank]).integers(-50, 50, SHAPE).astype(np.float32)


def allreduce(comm, check: Checker, call: int, paired, x=None) -> None:
    """Allreduce this rank's input of ``call``; it pairs with call ``paired(r)`` of each peer
    ``r``, whose inputs the reference sums."""
    x = inputs(comm.rank, call) if x is None else x
    comm.allreduce(x)
    want = inputs(comm.rank, call) + sum(inputs(r, paired(r)) for r in range(comm.size) if r != comm.rank)
    check.check(np.array_equal(x, want), f"call {call}: {x.ravel()[:4]} != {want.ravel()[:4]}")


def dump_of(comm, rank: int) -> str:
    """Where rank ``rank``'s dump goes: the job's folder, which every rank agreed on."""
    return os.path.join(comm.flow.recorder.folder(), f"comm0-rank{rank}.json")


def wait_for(path: str) -> None:
    until = time.monotonic() + 60
    while not os.path.exists(path) and time.monotonic() < until:
        time.sleep(0.05)


def fails(comm, check: Checker, call: int) -> None:
    """The call must end in a timeout or a peer's give-up, and leave the dump."""
    started = time.monotonic()
    check.raises(
        f"call {call}", (denseccl.CollectiveTimeoutError, denseccl.CommunicatorBrokenError),
        lambda: comm.allreduce(inputs(comm.rank, call)),
    )
    check.check(time.monotonic() - started < 60, "the failing call took over a minute")
    check.check(os.path.exists(dump_of(comm, comm.rank)), f"no dump at {dump_of(comm, comm.rank)}")


def skip(comm, check: Checker) -> None:
    rank = comm.rank
    if rank != 2:  # rank 2's call c + 1 pairs with this rank's call c from the skipped one on
        for call in range(CALLS - 1):
            allreduce(comm, check, call, lambda r, c=call: c + (r == 2 and c >= SKIPPED))
        fails(comm, check, CALLS - 1)
        wait_for(dump_of(comm, 2))  # leaving first would make the launcher end rank 2 before it dumps
        return
    for call in range(CALLS):
        if call != SKIPPED:
            allreduce(comm, check, call, lambda r, c=call: c - (c > SKIPPED))
    until = time.monotonic() + 60
    while comm.broken is None and time.monotonic() < until:  # a peer's give-up dumps here
        time.sleep(0.05)
    check.check(comm.broken is not None and "gave up" in comm.broken, f"rank 2 never heard: {comm.broken}")
    check.check(os.path.exists(dump_of(comm, rank)), f"no dump at {dump_of(comm, rank)}")


def stop(comm, check: Checker, world) -> None:
    rank = comm.rank
    pids = world.allgather(os.getpid())
    for call in range(STOPPED):
        allreduce(comm, check, call, lambda r, c=call: c)
    if rank == 1:
        os.kill(os.getpid(), signal.SIGSTOP)  # never resumed: rank 0 kills it
        check.fail("the stopped rank ran on")
        return
    fails(comm, check, STOPPED)
    done = os.path.join(os.environ["DENSECCL_TRACE_DIR"], "rank2-reported")
    if rank == 2:
        check.report()
        open(done, "w").close()
        time.sleep(60)  # the launcher ends this rank once rank 1 is killed
        os._exit(0)
    wait_for(done)
    code = check.report()
    os.kill(pids[1], signal.SIGKILL)
    os._exit(code)


def mismatch(comm, check: Checker) -> None:
    rank = comm.rank
    for call in range(CALLS):
        x = inputs(rank, call)
        if call == MISMATCHED:
            if rank == 1:
                x = np.asfortranarray(x)
            check.raises(f"call {call}", denseccl.MismatchError, lambda: comm.allreduce(x), contains="layout")
            continue
        allreduce(comm, check, call, lambda r, c=call: c, x)
    path = comm.dump_trace()
    check.check(path == dump_of(comm, rank), f"dump written to {path}")


def main() -> None:
    scenario, seconds = sys.argv[1], float(sys.argv[2])
    comm = denseccl.init(backend="mpi", timeout=seconds)
    check = Checker(f"recorder-{scenario}", comm.rank, comm.size)
    if scenario == "skip":
        skip(comm, check)
    elif scenario == "stop":
        from mpi4py import MPI

        stop(comm, check, MPI.COMM_WORLD)
    else:
        mismatch(comm, check)
    if scenario == "mismatch":
        check.finish()
    # skip: ranks leave through os._exit (abandoned requests) once all have reported: one leaving
    # first makes the launcher end the others before they report
    code = check.report()
    marker = os.path.join(os.environ["DENSECCL_TRACE_DIR"], "reported-rank{}")
    open(marker.format(comm.rank), "w").close()
    for rank in range(comm.size):
        wait_for(marker.format(rank))
    os._exit(code)


if __name__ == "__main__":
    main()
