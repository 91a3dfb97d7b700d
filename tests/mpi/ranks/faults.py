"""Rank program: a peer paused right after it posted a transfer (issue: fault containment).

Rank 1 stops itself with SIGSTOP right after its transfer of SCENARIO was posted; rank 0 times
out, drops everything the call used, allocates a new array (often at the same address) and only
then resumes rank 1 with SIGCONT. Then both ranks drive MPI progress on another communicator.
Checked:

- rank 0 gets CollectiveTimeoutError, and its new, unrelated array never changes (before the fix
  the resumed transfer wrote into the freed memory);
- rank 1 does not complete the call that paired with the abandoned one: it raises
  CommunicatorBrokenError (the peer gave up), as does its next call;
- both ranks' other communicator still works and gives the right answer.

Scenarios: ``sync`` (64 MB float64 allreduce, full path), ``split`` (64 MB float16 allreduce,
reduce-scatter + allgather), ``plan`` (allreduce replayed by a plan), ``plan-bcast`` (broadcast
replayed, root 1), ``async`` (Work.wait times out), ``torch-async`` (torch.distributed Work of
the denseccl backend).

usage: mpiexec -n 2 python faults.py SCENARIO TIMEOUT
"""

from __future__ import annotations

import gc
import os
import signal
import sys
import time

import numpy as np

import denseccl
from tests.support.checker import Checker

COUNT = 8 << 20  # 64 MB of float64


class PauseAfterPost:
    """Wraps a transport's mpi4py communicator: once armed, the next nonblocking call returns
    its request only after this process was stopped (SIGSTOP) and resumed (SIGCONT); so does
    the next ``Start`` of a persistent request it set up (``*_init``: plan replays)."""

    def __init__(self, comm):
        self._comm = comm
        self.armed = False

    def pause(self) -> None:
        if self.armed:
            self.armed = False
            os.kill(os.getpid(), signal.SIGSTOP)

    def __getattr__(self, name):
        real = getattr(self._comm, name)
        if name.endswith("_init"):
            return lambda *args, **kwargs: PausingRequest(real(*args, **kwargs), self)
        if not name.startswith("I"):
            return real

        def posted(*args, **kwargs):
            request = real(*args, **kwargs)
            self.pause()
            return request

        return posted


class PausingRequest:
    """A persistent request whose ``Start`` pauses once its communicator's wrapper is armed."""

    def __init__(self, request, pauser: PauseAfterPost):
        self._request = request
        self._pauser = pauser
        self.Test = request.Test
        self.Free = request.Free

    def Start(self) -> None:  # noqa: N802 - mpi4py's name
        self._request.Start()
        self._pauser.pause()


def make(scenario: str, rank: int):
    if scenario == "torch-async":
        import torch

        return torch.full((COUNT,), rank + 1.0, dtype=torch.float64)
    if scenario == "split":
        return np.full(COUNT * 2, rank + 1, np.float16)  # 32 M halves = 64 MB
    if scenario in ("plan", "plan-bcast"):
        return np.full((64, 1024), rank + 1, np.float64)
    return np.full(COUNT, rank + 1, np.float64)


def call(comm, scenario: str, x):
    if scenario == "plan-bcast":
        return comm.broadcast(x, 1)
    if scenario == "async":
        return comm.allreduce(x, async_op=True).wait()
    if scenario == "torch-async":
        import torch.distributed as dist

        return dist.all_reduce(x, async_op=True).wait()
    return comm.allreduce(x)


def pointer(x) -> int:
    return x.ctypes.data if isinstance(x, np.ndarray) else x.data_ptr()


def torch_communicator(seconds: float):
    """The denseccl communicator under torch.distributed's default group (denseccl backend)."""
    import datetime

    import torch
    import torch.distributed as dist

    import denseccl.torch as dt

    dt.init_process_group(timeout=datetime.timedelta(seconds=seconds))
    dist.all_reduce(torch.ones(2))  # builds the group's host communicator
    return dist.group.WORLD.host_communicator  # the group is denseccl's ProcessGroupDenseCCL


def main() -> None:
    scenario, seconds = sys.argv[1], float(sys.argv[2])
    if scenario == "torch-async":
        comm = torch_communicator(seconds)
    else:
        comm = denseccl.init(backend="mpi", timeout=seconds)
    final = denseccl.init(backend="mpi", timeout=120)
    rank, size = comm.rank, comm.size
    check = Checker(f"faults-{scenario}", rank, size)
    pids = final.allgather(np.array([os.getpid()], np.int64))[:, 0].tolist()
    pause = PauseAfterPost(comm.transport.comm)
    comm.transport.comm = pause
    if scenario.startswith("plan"):  # the first call of the geometry leaves the plan
        warm = make(scenario, rank)
        call(comm, scenario, warm)
    final.barrier()

    if rank == 1:
        x = make(scenario, rank)
        pause.armed = True
        # Over MPI the news travels as a message that MPI may deliver only once the rank that
        # gave up calls MPI again: the root of a broadcast, which only sends (nothing it gets
        # back can be garbage), may then complete; its next call fails (checked below).
        lenient = scenario == "plan-bcast" and comm.control.board is None
        try:
            call(comm, scenario, x)
            check.check(lenient, "the paused rank completed a call its peer had abandoned")
        except denseccl.CommunicatorBrokenError as error:
            check.check("gave up" in str(error), f"paused rank: message {error}")
        except Exception as error:  # noqa: BLE001 - torch's Work wraps the error it carries
            check.check(
                scenario == "torch-async" and "gave up" in str(error),
                f"paused rank raised {type(error).__name__}: {error}",
            )
        check.check(pause.armed is False, "the pause was never reached")
    else:
        x = make(scenario, rank)
        address = pointer(x)
        started = time.monotonic()
        try:
            call(comm, scenario, x)
            check.fail("rank 0 completed although its peer was stopped")
        except denseccl.CollectiveTimeoutError:
            elapsed = time.monotonic() - started
            check.check(elapsed < seconds + 10, f"timed out late: after {elapsed:.1f} s")
        except Exception as error:  # noqa: BLE001 - torch's Work wraps the error it carries
            timed_out = "did not complete within the timeout" in str(error)
            check.check(scenario == "torch-async" and timed_out, f"rank 0 raised {type(error).__name__}: {error}")
        del x
        gc.collect()
        fresh = make(scenario, 6)  # unrelated memory, possibly where x was
        expected = fresh.copy() if isinstance(fresh, np.ndarray) else fresh.clone()
        reuses = "reuses" if pointer(fresh) == address else "does not reuse"
        print(f"rank 0: new array {reuses} the old address", flush=True)
        os.kill(pids[1], signal.SIGCONT)
    for _ in range(3):  # drive MPI progress: the abandoned request may still move now
        final.barrier()
        time.sleep(0.2)
    if rank == 0:
        check.check(bool((fresh == expected).all()), f"an unrelated array changed: {fresh[:5]}")
    for name, comm_ in (("the faulted communicator", comm),):
        try:
            comm_.allreduce(np.ones(4))
            check.fail(f"a later call on {name} succeeded")
        except denseccl.CommunicatorBrokenError:
            pass
        except Exception as error:  # noqa: BLE001
            check.fail(f"a later call on {name} raised {type(error).__name__}: {error}")
    y = np.full(5, rank + 1.0)
    final.allreduce(y)
    check.check(y.tolist() == [sum(range(1, size + 1))] * 5, f"the other communicator: {y}")
    check.finish(hard_exit=True, before_exit=final.barrier)


if __name__ == "__main__":
    main()
