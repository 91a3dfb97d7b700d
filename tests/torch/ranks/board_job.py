"""Rank program: the agreement board without MPI, under torchrun or mp.spawn.

usage: board_job.py SCENARIO [spawn N]   (torchrun sets the ranks; "spawn N" starts N itself)
       board_job.py hosts PER_HOST          (torchrun on each simulated host, tests/hosts)

Scenarios (every result against a reference built from every rank's inputs):
- calls: the torch backend on a counting store: the world group, a subgroup per pair of ranks
  and a split agree on the board (judged crowded when the ranks share cores; its waits sleep on
  doorbells either way, leaving the cores to gloo's threads); all_reduce, broadcast,
  all_gather_into_tensor and reduce_scatter_tensor on channels-last tensors; a layout mismatch
  raising MismatchError on every rank with the buffers untouched; and no store operation in 40
  calls once the group exists. Nothing named of this job is left in /dev/shm after init.
- late: the last rank never arrives at a call: its peers raise CollectiveTimeoutError (or, once
  the first has given up, CommunicatorBrokenError through the board's flag); when the late rank
  arrives it sees the flag and raises CommunicatorBrokenError at once.
- hosts: the calls scenario across hosts of PER_HOST ranks each: the world group agrees on a
  board per host and among one leader per host (a gloo group), a subgroup within a host on its
  board, a subgroup of one rank per host among leaders only; no store operation per call.
- killed: after a call, the last rank is killed (SIGKILL); the others wait in the next call
  until the launcher ends the job.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import torch
import torch.distributed as dist

import denseccl
import denseccl.torch as dt
from denseccl.channel.shared import SharedControl
from denseccl.channel.segment import PREFIX
from denseccl.wait import WAITING
from tests.support.checker import Checker
from tests.support.counting_store import env_counting_store
from tests.torch.ranks.common import start

SCENARIO = sys.argv[1]


def values(seed: int, r: int, shape: tuple) -> torch.Tensor:
    return torch.rand(shape, generator=torch.Generator().manual_seed(seed * 101 + r), dtype=torch.float64).float()


def channels_last(seed: int, r: int) -> torch.Tensor:
    return values(seed, r, (2, 3, 4, 5)).to(memory_format=torch.channels_last)


SHM = "/dev/shm"


def my_segments() -> list:
    """Anything of denseccl's in /dev/shm (never: its segments have no name)."""
    return [name for name in os.listdir(SHM) if name.startswith(PREFIX)] if os.path.isdir(SHM) else []


def on_board(check: Checker, name: str, communicator: denseccl.Communicator, ranks: int, hosts: int = 1) -> None:
    """The communicator agrees on its host's board (of ``ranks`` ranks) and, across ``hosts``
    hosts, among their leaders."""
    control = communicator.control
    if not check.check(isinstance(control, SharedControl), f"{name}: agreement over {control!r}, expected boards"):
        return
    assert isinstance(control, SharedControl)
    check.check(len(control.layout.hosts) == hosts, f"{name}: {control.path()}, expected {hosts} host(s)")
    leader = control.layout.leaders[control.layout.mine] == control.rank
    check.check((control.leaders is not None) == (hosts > 1 and leader), f"{name}: leaders' channel {control.leaders}")
    check.check((control.board is not None) == (ranks > 1), f"{name}: board {control.board} for {ranks} ranks here")
    if control.board is not None:
        crowded = len(os.sched_getaffinity(0)) < ranks
        check.check(control.crowded == crowded, f"{name}: judged crowded={control.crowded}, expected {crowded}")
        # the gloo engine's board waits sleep on doorbells whether crowded or not (open_shared's sleepy)
        check.check(control.board.crowded and WAITING.crowded and WAITING.doorbells is not None,
                    f"{name}: the board's waits spin (crowded={control.board.crowded}, {WAITING.doorbells})")


def host_communicator(group: object) -> denseccl.Communicator:
    """The denseccl communicator that moves the CPU tensors of ``group`` (None: the world)."""
    group = dist.group.WORLD if group is None else group
    if isinstance(group, dt.ProcessGroupDenseCCL):
        return group.host_communicator
    backend = group._get_backend(torch.device("cpu"))  # type: ignore[attr-defined]
    assert isinstance(backend, dt.ProcessGroupDenseCCL), type(backend)
    return backend.host_communicator


def exercise(
    check: Checker, name: str, group: object, members: list, seed: int, store: object, per_host: int = 0
) -> None:
    """``per_host``: ranks per simulated host (0: one host)."""
    rank = dist.get_rank()
    if per_host:
        here = [r for r in members if r // per_host == rank // per_host]
        on_board(check, name, host_communicator(group), len(here), len({r // per_host for r in members}))
    else:
        on_board(check, name, host_communicator(group), len(members))
    x = channels_last(seed, rank)
    dist.all_reduce(x, group=group)  # the first call: anything lazy happens here
    before = store.ops
    for step in range(10):
        x = channels_last(seed + step, rank)
        dist.all_reduce(x, group=group)
        want = sum(values(seed + step, r, (2, 3, 4, 5)) for r in members)
        check.check(torch.allclose(x, want, atol=1e-5) and x.stride() == channels_last(0, 0).stride(),
                    f"{name}: all_reduce {step} differs from the reference")
        y = values(seed + step, rank, (5, 3)).t()
        dist.broadcast(y, group_src=len(members) - 1, group=group)
        check.check(torch.equal(y, values(seed + step, members[-1], (5, 3)).t()), f"{name}: broadcast {step}")
        out = torch.empty(len(members) * 2, 3, 4, 5)
        dist.all_gather_into_tensor(out, values(seed + step, rank, (2, 3, 4, 5)), group=group)
        want = torch.cat([values(seed + step, r, (2, 3, 4, 5)) for r in members])
        check.check(torch.equal(out, want), f"{name}: all_gather_into_tensor {step}")
        stacked = torch.cat([values(seed + step, rank, (2, 6)) * (i + 1) for i in range(len(members))])
        block = torch.empty(2, 6)
        dist.reduce_scatter_tensor(block, stacked, group=group)
        want = sum(values(seed + step, r, (2, 6)) for r in members) * (members.index(rank) + 1)
        check.check(torch.allclose(block, want, atol=1e-5), f"{name}: reduce_scatter_tensor {step}")
    check.check(store.ops == before, f"{name}: {store.ops - before} store operations in 40 calls, expected none")
    z = torch.full((3, 4), 7.0) if members.index(rank) else torch.full((4, 3), 7.0).t()  # another layout on one
    try:
        dist.all_reduce(z, group=group)
        check.fail(f"{name}: a layout mismatch raised nothing")
    except denseccl.MismatchError as error:
        check.check("mismatch" in str(error), f"{name}: {error}")
    check.check(bool((z == 7).all()), f"{name}: a buffer was written before the mismatch error")
    ones = torch.ones(7)
    dist.all_reduce(ones, group=group)
    check.check(torch.equal(ones, torch.full((7,), float(len(members)))), f"{name}: unusable after the mismatch")


def calls(check: Checker, rank: int, size: int, store: object) -> None:
    check.check(my_segments() == [], f"segments of this rank left in {SHM}: {my_segments()}")
    exercise(check, "world", None, list(range(size)), 1, store)
    pairs = [dist.new_group([p, p + 1], backend="denseccl") for p in range(0, size - 1, 2)]
    if rank < size - size % 2:
        exercise(check, "pair", pairs[rank // 2], [rank - rank % 2, rank - rank % 2 + 1], 2, store)
    part = host_communicator(None).split(rank % 2, key=rank)
    assert part is not None
    if part.size > 1:
        on_board(check, "split", part, part.size)
    x = torch.full((4, 5), float(rank)).t()
    before = store.ops
    part.allreduce(x)
    check.check(torch.equal(x, torch.full((5, 4), float(sum(r for r in range(size) if r % 2 == rank % 2)))),
                "split: allreduce differs from the reference")
    check.check(store.ops == before, "split: a store operation in a call")
    check.check(my_segments() == [], f"segments of this rank left in {SHM}: {my_segments()}")


def across(check: Checker, rank: int, size: int, per_host: int, store: object) -> None:
    check.check(my_segments() == [], f"segments of this rank left in {SHM}: {my_segments()}")
    hosts = size // per_host
    exercise(check, "world", None, list(range(size)), 1, store, per_host)
    within = [dist.new_group([h * per_host + i for i in range(per_host)], backend="denseccl") for h in range(hosts)]
    mine = [rank // per_host * per_host + i for i in range(per_host)]
    exercise(check, "within a host", within[rank // per_host], mine, 2, store, per_host)
    spread = [dist.new_group([h * per_host + i for h in range(hosts)], backend="denseccl") for i in range(per_host)]
    exercise(check, "one per host", spread[rank % per_host], [h * per_host + rank % per_host for h in range(hosts)],
             3, store, per_host)
    check.check(my_segments() == [], f"segments of this rank left in {SHM}: {my_segments()}")


def late(check: Checker, rank: int, size: int) -> None:
    comm = denseccl.init(backend="gloo", timeout=3)
    on_board(check, "late", comm, size)
    x = torch.ones(16)
    comm.allreduce(x)
    check.check(torch.equal(x, torch.full((16,), float(size))), "late: the first call")
    if rank == size - 1:
        time.sleep(8)  # its peers time out meanwhile
        started = time.monotonic()
        error = check.raises("late rank", denseccl.CommunicatorBrokenError, lambda: comm.allreduce(x), "gave up")
        check.check(time.monotonic() - started < 2.5, "late: the late rank waited instead of seeing the flag")
        print(f"late rank: {error}", flush=True)
        return
    try:
        comm.allreduce(x)
        check.fail("late: a call without the last rank completed")
    except denseccl.CollectiveTimeoutError as error:
        print(f"rank {rank} timed out: {error}", flush=True)
    except denseccl.CommunicatorBrokenError as error:
        check.check("gave up" in str(error), f"late: {error}")
        print(f"rank {rank} saw a peer give up: {error}", flush=True)
    check.check(torch.equal(x, torch.full((16,), float(size))), "late: the buffer changed")


def killed(check: Checker, rank: int, size: int) -> None:
    comm = denseccl.init(backend="gloo", timeout=120)
    on_board(check, "killed", comm, size)
    x = torch.ones(16)
    comm.allreduce(x)
    check.check(torch.equal(x, torch.full((16,), float(size))), "killed: the first call")
    if not check.failures:  # on the board, and the first call agreed there
        print(f"[board-killed] rank {rank} pid {os.getpid()} ready", flush=True)
    time.sleep(0.5)
    if rank == size - 1:
        os.kill(os.getpid(), signal.SIGKILL)
    comm.allreduce(x)  # waits on the board until the launcher ends the job
    check.fail("killed: a call completed without the killed rank")


def main(rank: int, size: int) -> None:
    torch.set_num_threads(1)
    print(f"[board-pid] {os.getpid()}", flush=True)
    check = Checker(f"board-{SCENARIO}", rank, size)
    if SCENARIO == "calls":
        store = env_counting_store(rank, size)
        dist.init_process_group("denseccl", store=store, rank=rank, world_size=size)
        calls(check, rank, size, store)
        dist.destroy_process_group()
    elif SCENARIO == "hosts":
        store = env_counting_store(rank, size)
        dist.init_process_group("denseccl", store=store, rank=rank, world_size=size)
        across(check, rank, size, int(sys.argv[2]), store)
        dist.destroy_process_group()
    elif SCENARIO == "late":
        late(check, rank, size)
    elif SCENARIO == "killed":
        killed(check, rank, size)
    check.done()


if __name__ == "__main__":
    start(main, int(sys.argv[3]) if sys.argv[2:3] == ["spawn"] else None)
