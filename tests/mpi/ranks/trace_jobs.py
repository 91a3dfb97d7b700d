"""Rank program: one job that dumps its flight recorder on request (tests/mpi/test_recorder.py
runs several on one host). Each rank makes three allreduces, checked against NumPy over every
rank's inputs, then ``denseccl.dump_traces()``; every rank prints the job id its communicator
agreed on and the paths written (rank 0 prints every rank's: ``job <id>``, ``dumped <path>``).

- ``dump``: the dump must be written into the job's folder, the same folder on every rank;
- ``refused``: the dump folder is not safe: no path may come back, the job goes on (a warning).

usage: mpiexec -n N python trace_jobs.py dump|refused
"""

from __future__ import annotations

import os
import sys

import numpy as np
from mpi4py import MPI

import denseccl
from tests.support.checker import Checker


def inputs(rank: int, call: int) -> np.ndarray:
    return np.random.default_rng([call, rank]).integers(-50, 50, (4, 6)).astype(np.float32)


def main() -> None:
    mode = sys.argv[1]
    comm = denseccl.init(backend="mpi")
    check = Checker(f"trace-jobs-{mode}", comm.rank, comm.size)
    for call in range(3):
        x = inputs(comm.rank, call).T  # a transposed layout, as it is
        comm.allreduce(x)
        want = sum(inputs(r, call) for r in range(comm.size)).T
        check.check(np.array_equal(x, want), f"allreduce {call}: {x.ravel()[:4]} != {want.ravel()[:4]}")
    job = comm.flow.recorder.job
    jobs = MPI.COMM_WORLD.gather(job)
    paths = denseccl.dump_traces()
    everyone = MPI.COMM_WORLD.gather(paths)
    if comm.rank == 0:  # one writer: lines of several ranks may interleave
        check.check(len(set(jobs)) == 1, f"the ranks agreed on different job ids: {jobs}")
        print("".join(f"job {j}\n" for j in jobs) + "".join(f"dumped {p}\n" for ps in everyone for p in ps), end="")
    if mode == "dump":
        mine = os.path.join(comm.flow.recorder.folder(), f"comm0-rank{comm.rank}.json")
        check.check(paths == [mine], f"dumped {paths}, not {mine}")
        check.check(os.path.basename(os.path.dirname(mine)) == job, f"{mine} is not in the job's folder")
    else:
        check.check(paths == [], f"an unsafe folder received {paths}")
    comm.allreduce(np.ones(3))  # the communicator is still usable
    comm.close()
    check.finish()


if __name__ == "__main__":
    main()
