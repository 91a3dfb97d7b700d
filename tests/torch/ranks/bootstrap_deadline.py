"""A peer that never calls the bootstrap (issue 10 item 4): every other rank must raise
CollectiveTimeoutError within the timeout, at every bootstrap step.

usage: python bootstrap_deadline.py MODE SECONDS SKIPPER, under mpiexec or torchrun. MODE:
``torch-init`` (denseccl.torch.init_process_group(timeout=SECONDS)), ``dist-init``
(dist.init_process_group("denseccl", timeout=timedelta)), ``numpy-init``
(denseccl.init(timeout=SECONDS)), ``subgroup`` (the world starts; then the skipper never calls
new_group). The skipper prints its summary first and sleeps; the others leave with os._exit
once they have checked (a timed-out MPI request can never complete, so no MPI_Finalize)."""

from __future__ import annotations

import datetime
import os
import sys
import time

import torch.distributed as dist

import denseccl
import denseccl.torch as dt
from denseccl.config import launched_by_mpi
from tests.support.checker import Checker

mode, seconds, skipper = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
#: how long a waiting rank lingers after its verdict (less than the skipper's sleep)
GRACE_SECONDS = 5.0
if launched_by_mpi():
    from mpi4py import MPI  # MPI_Init itself waits for every rank (the MPI library's PMI barrier)

    rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
else:
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
skipper %= size
check = Checker(f"bootstrap-deadline-{mode}", rank, size)


def step() -> None:
    if mode == "torch-init":
        dt.init_process_group(timeout=seconds)
    elif mode == "dist-init":
        dist.init_process_group("denseccl", timeout=datetime.timedelta(seconds=seconds))
    elif mode == "numpy-init":
        denseccl.init(timeout=seconds)
    elif mode == "subgroup":
        dist.new_group(list(range(size)), backend="denseccl", timeout=datetime.timedelta(seconds=seconds))
    else:
        raise SystemExit(f"unknown mode {mode}")


if mode == "subgroup":
    dt.init_process_group(timeout=120)
    dist.barrier()
    check.check(dist.get_world_size() == size, f"the world group has {dist.get_world_size()} ranks, not {size}")
else:  # the premise: nothing joined a process group before the step under test
    check.check(not dist.is_initialized(), "a process group exists before the step")
if launched_by_mpi():  # the timeouts start together, so the waiting ranks report together
    joined = MPI.COMM_WORLD.allreduce(1)
    check.check(joined == size, f"{joined} of {size} ranks reached the start")
if rank == skipper:
    check.report()  # before the sleep: the job ends when the waiting ranks leave
    time.sleep(seconds + 20)
    os._exit(0)
started = time.monotonic()
try:
    step()
    check.fail(f"{mode}: returned although rank {skipper} never called it")
except denseccl.CollectiveTimeoutError as error:
    elapsed = time.monotonic() - started
    check.check(elapsed <= seconds + 5, f"{mode}: raised after {elapsed:.1f} s, timeout {seconds} s")
    print(f"rank {rank}: {mode} raised CollectiveTimeoutError after {elapsed:.1f} s: {str(error)[:160]}", flush=True)
except Exception as error:  # noqa: BLE001
    check.fail(f"{mode}: raised {type(error).__name__} instead: {error}")
# mpiexec ends the whole job once a rank leaves without MPI_Finalize: give another waiting rank
# (three ranks) the time to print its verdict first
check.finish(hard_exit=True, before_exit=lambda: time.sleep(GRACE_SECONDS if size > 2 else 0))
