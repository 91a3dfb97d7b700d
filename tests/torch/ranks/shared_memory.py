"""The board's shared memory under the conditions users meet, on real ranks under torchrun.

usage: shared_memory.py full | mesh | unmade | no-data | limits | churn N | stopped

- full: run in a private mount namespace whose /dev/shm is a tiny tmpfs that another process
  filled (tests/torch/test_shared_memory.py): ``init_process_group("denseccl")``, repeated small
  all_reduces (the host path), a 1 MiB one and a broadcast give the right values; the board and
  the host path are in use (their memory needs no room in /dev/shm). Before segments were
  memfds, both ranks died of SIGBUS at the first write.
- mesh: in that full /dev/shm, 8 ranks with a 2x4 DeviceMesh (a group per row and per column)
  and a subgroup of the even ranks: every group's all_reduce right, each on a board of its own.
- unmade: the host's first rank cannot make a segment (``memfd_create`` fails with ENOMEM, as
  where memory is short): every rank falls back to gloo's round together, with results right.
- no-data: the host's first rank has room for the board but not for the host path's data area
  (``posix_fallocate`` fails above 64 KiB): every rank keeps the board, none has the host path
  ("the host path is off" logged once), results right.
- limits: the ranks set different ``DENSECCL_HOST_PATH`` (rank r: 1024 * (r + 1)): they keep
  the board and all take the smallest limit (before, the segment's sizes differed and every
  rank dropped the board).
- churn N: N communicators made and closed, each through ``denseccl.init`` and through torch's
  ``new_group``/``destroy_process_group``: this process's mappings, descriptors and segments
  stay flat (the same after the last as after the first few).
- stopped: the last rank stops itself (SIGSTOP) for 6 s while rank 0 waits for it in a
  call's agreement step; from 1.5 s to 5 s into that wait rank 0 uses about 1% of a core or
  less (checked: under 3%; before waits backed off: 8-10%). The call's result is right once the peer resumes.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any, List, Tuple

import torch
import torch.distributed as dist

import denseccl
import denseccl.torch
from denseccl.channel.shared import SharedControl
from tests.support.checker import Checker


def calls(check: Checker, comm: Any, rank: int, size: int, name: str) -> None:
    """Repeated small in-place all_reduces (the host path from the second on), a 1 MiB one and a
    broadcast, each against every rank's inputs."""
    total = size * (size + 1) / 2
    for round_ in range(5):
        x = torch.full((64,), float(rank + 1 + round_))
        comm.allreduce(x)
        check.check(torch.equal(x, torch.full((64,), total + size * round_)), f"{name}: small call {round_}: {x[:3]}")
    big = torch.full((1 << 18,), float(rank + 1))
    comm.allreduce(big)
    check.check(torch.equal(big, torch.full((1 << 18,), total)), f"{name}: 1 MiB all_reduce gave {big[:3]}")
    y = torch.full((1000,), float(rank))
    comm.broadcast(y, root=size - 1)
    check.check(torch.equal(y, torch.full((1000,), float(size - 1))), f"{name}: broadcast gave {y[:3]}")
    for round_ in range(3):  # through the segment too: allgather, reduce-scatter, barrier
        comm.barrier()
        z = torch.full((3, 5), float(rank + round_)).t()
        every = comm.allgather(z)
        want = torch.stack([torch.full((5, 3), float(r + round_)) for r in range(size)])
        check.check(torch.equal(every, want), f"{name}: allgather {round_} gave {every[:, 0, 0]}")
        part = comm.reduce_scatter(torch.arange(size * 7, dtype=torch.int64).view(size, 7) * (rank + 1))
        want_part = torch.arange(rank * 7, rank * 7 + 7, dtype=torch.int64) * int(total)
        check.check(torch.equal(part, want_part), f"{name}: reduce_scatter {round_} gave {part}")


def full(check: Checker, rank: int, size: int) -> None:
    room = os.statvfs("/dev/shm")
    check.check(room.f_bavail * room.f_frsize < 64 * 1024, "this job's /dev/shm is not full")
    dist.init_process_group("denseccl")
    x = torch.full((3, 4), float(rank + 1)).t()
    dist.all_reduce(x)
    check.check(torch.equal(x, torch.full((4, 3), size * (size + 1) / 2)), f"full: all_reduce gave {x}")
    comm = denseccl.init(backend="gloo")
    check.check(isinstance(comm.control, SharedControl) and comm.control.board is not None,
                f"full: no board: {comm.control!r}")
    check.check(comm.transport.host is not None, "full: no host path")
    calls(check, comm, rank, size, "full")
    comm.close()
    dist.destroy_process_group()


def mesh(check: Checker, rank: int, size: int) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("denseccl")
    grid = init_device_mesh("cpu", (2, size // 2), mesh_dim_names=("row", "column"))
    evens = dist.new_group(list(range(0, size, 2)), backend="denseccl")
    for name in ("row", "column"):
        group = grid.get_group(name)
        members = dist.get_process_group_ranks(group)
        x = torch.full((5, 3), float(rank + 1)).t()
        dist.all_reduce(x, group=group)
        want = float(sum(r + 1 for r in members))
        check.check(torch.equal(x, torch.full((3, 5), want)), f"mesh: {name} all_reduce gave {x[0, 0]}, not {want}")
    if rank % 2 == 0:
        y = torch.full((100,), float(rank))
        dist.all_reduce(y, group=evens)
        check.check(torch.equal(y, torch.full((100,), float(sum(range(0, size, 2))))), f"mesh: evens gave {y[0]}")
    dist.barrier()
    dist.destroy_process_group()


def unmade(check: Checker, rank: int, size: int) -> None:
    def no_memory(*_: Any) -> int:
        raise OSError(errno.ENOMEM, "Cannot allocate memory")

    if rank == 0:  # the host's first rank makes the segment
        os.memfd_create = no_memory  # type: ignore[assignment]
    comm = denseccl.init(backend="gloo")
    check.check(not isinstance(comm.control, SharedControl), f"unmade: a board on rank {rank}: {comm.control!r}")
    check.check(comm.transport.host is None, "unmade: a host path without a segment")
    calls(check, comm, rank, size, "unmade")
    comm.close()


def no_data(check: Checker, rank: int, size: int) -> None:
    if rank == 0:
        real = os.posix_fallocate

        def small_only(descriptor: int, offset: int, length: int) -> None:
            if length > 65536:
                raise OSError(errno.ENOSPC, "No space left on device")
            real(descriptor, offset, length)

        os.posix_fallocate = small_only  # type: ignore[assignment]
    comm = denseccl.init(backend="gloo")
    check.check(isinstance(comm.control, SharedControl) and comm.control.board is not None, "no-data: no board")
    check.check(comm.transport.host is None, "no-data: a host path without its data area")
    calls(check, comm, rank, size, "no-data")
    comm.close()


def limits(check: Checker, rank: int, size: int) -> None:
    comm = denseccl.init(backend="gloo")
    host = comm.transport.host
    check.check(host is not None and host.limit == 1024, f"limits: rank {rank} has host path {host and host.limit}")
    calls(check, comm, rank, size, "limits")
    comm.close()


def footprint() -> Tuple[int, int, int]:
    """This process's mappings, open descriptors and mapped memfd segments."""
    with open("/proc/self/maps") as maps:
        lines = maps.readlines()
    return len(lines), len(os.listdir("/proc/self/fd")), sum("/memfd:denseccl" in line for line in lines)


def churn(check: Checker, rank: int, size: int, rounds: int) -> None:
    dist.init_process_group("denseccl")
    marks = []
    for round_ in range(rounds):
        comm = denseccl.init(backend="gloo")
        x = torch.full((16,), float(rank + 1))
        for _ in range(2):  # the second is the host path: its slots are views of the segment
            comm.allreduce(x)
        comm.close()
        group = dist.new_group(list(range(size)), backend="denseccl")
        y = torch.ones(16)
        dist.all_reduce(y, group=group)
        dist.destroy_process_group(group)
        dist.destroy_process_group()  # and the default group, as an elastic restart does
        dist.init_process_group("denseccl")
        check.check(float(x[0]) == size * (size + 1) / 2 * size and float(y[0]) == size, f"churn: round {round_}")
        if round_ in (4, rounds - 1):
            marks.append(footprint())
    first, last = marks
    check.check(last[2] <= first[2] <= 2, f"churn: mapped segments {first[2]} after 5 rounds, {last[2]} at the end")
    check.check(last[0] <= first[0] + 8, f"churn: mappings grew from {first[0]} to {last[0]} in {rounds} rounds")
    check.check(last[1] <= first[1] + 4, f"churn: descriptors grew from {first[1]} to {last[1]} in {rounds} rounds")
    print(f"[footprint] rank {rank}: after 5 rounds {first}, after {rounds} {last}", flush=True)
    dist.destroy_process_group()


def stopped(check: Checker, rank: int, size: int) -> None:
    comm = denseccl.init(backend="gloo", timeout=60)
    x = torch.ones(64)
    for _ in range(3):
        comm.allreduce(x)
        x.fill_(1.0)
    comm.barrier()
    if rank == size - 1:
        subprocess.Popen(["sh", "-c", f"sleep 6; kill -CONT {os.getpid()}"])
        os.kill(os.getpid(), signal.SIGSTOP)
    elif rank == 0:
        samples: List[float] = []

        def sample() -> None:
            for pause in (1.5, 3.5):
                time.sleep(pause)
                samples.append(time.process_time())

        sampler = threading.Thread(target=sample)
        time.sleep(0.5)  # the peer is stopped by now
        sampler.start()
        comm.allreduce(x)
        sampler.join()
        share = (samples[1] - samples[0]) / 3.5
        print(f"[idle] rank 0 used {100 * share:.2f}% of a core waiting for a stopped peer", flush=True)
        # measured 0.5-1.1% (the whole process: torch's and gloo's threads too); a wait that polls
        # or yields takes 8-10%: the bound tells the two apart without timing the machine
        check.check(share < 0.03, f"stopped: waiting for a stopped peer took {100 * share:.1f}% of a core")
    if rank != 0:
        comm.allreduce(x)
    check.check(torch.equal(x, torch.full((64,), float(size))), f"stopped: the call gave {x[:3]}")
    comm.close()


def main() -> None:
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    scenario = sys.argv[1]
    if scenario == "limits":  # read once, at the first communicator
        os.environ["DENSECCL_HOST_PATH"] = str(1024 * (rank + 1))
    check = Checker(f"shm-{scenario}", rank, size)
    scenarios = {"full": full, "mesh": mesh, "unmade": unmade, "no-data": no_data, "limits": limits,
                 "stopped": stopped}
    if scenario in scenarios:
        scenarios[scenario](check, rank, size)
    else:
        churn(check, rank, size, int(sys.argv[2]))
    check.done()


if __name__ == "__main__":
    main()
