"""Rank program: a peer that never joins.

The last rank (the skipper) leaves out one collective on each of three communicators; every
other rank must get CollectiveTimeoutError after about the communicator's timeout, and a later
call on that communicator must raise CommunicatorBrokenError; so must the skipper's, whose
peers told it that they gave up. The timeouts come from
init(timeout=...) (comm_a, comm_c) and from DENSECCL_TIMEOUT (comm_b).

Ranks leave with os._exit: the timed-out requests can never complete, so MPI_Finalize is skipped.

usage: DENSECCL_TIMEOUT=4 mpiexec -n N python timeouts.py SHORT_TIMEOUT
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

import denseccl
from tests.support.checker import Checker
from tests.support.layouts import raw_bytes


def expect_timeout(check: Checker, comm, what: str, seconds: float, thunk, buffers=()) -> None:
    before = [raw_bytes(b) for b in buffers]
    started = time.monotonic()
    try:
        thunk()
        check.fail(f"{what}: returned although a peer never joined")
    except denseccl.CollectiveTimeoutError as error:
        elapsed = time.monotonic() - started
        check.check(
            seconds * 0.9 <= elapsed <= seconds + 5, f"{what}: timed out after {elapsed:.2f} s, timeout {seconds} s"
        )
        check.check("timeout" in str(error) and "broken" in str(error), f"{what}: message {error}")
        check.check(isinstance(error, TimeoutError), f"{what}: not a TimeoutError")
    except denseccl.CommunicatorBrokenError as error:  # another waiter timed out first and told this rank
        elapsed = time.monotonic() - started
        check.check(comm.size > 2 and "gave up" in str(error), f"{what}: {error}")
        check.check(elapsed <= seconds + 5, f"{what}: the news that a peer gave up came after {elapsed:.2f} s")
    except Exception as error:  # noqa: BLE001
        check.fail(f"{what}: raised {type(error).__name__} instead: {error}")
    for buffer, snapshot in zip(buffers, before):
        check.check(raw_bytes(buffer) == snapshot, f"{what}: buffer written")
    check.check(comm.broken is not None and "timed out" in comm.broken, f"{what}: broken = {comm.broken!r}")
    for name, later in (
        ("allreduce", lambda: comm.allreduce(np.zeros(2))),
        ("barrier", comm.barrier),
        ("broadcast", lambda: comm.broadcast(np.zeros(2))),
    ):
        try:
            later()
            check.fail(f"{what}: a later {name} succeeded on a broken communicator")
        except denseccl.CommunicatorBrokenError as error:
            check.check("unusable" in str(error) and "timed out" in str(error), f"{what}: later {name}: {error}")
        except Exception as error:  # noqa: BLE001
            check.fail(f"{what}: later {name} raised {type(error).__name__}: {error}")


def main() -> None:
    short = float(sys.argv[1])
    from_env = float(os.environ["DENSECCL_TIMEOUT"])
    from mpi4py import MPI

    # line the ranks up first: init's own deadline is the (short) timeout under test, and ranks
    # that start seconds apart on a loaded machine would time out there instead
    MPI.COMM_WORLD.Barrier()
    comm_a = denseccl.init(backend="mpi", timeout=short)
    comm_b = denseccl.init(backend="mpi")  # DENSECCL_TIMEOUT
    comm_c = denseccl.init(backend="mpi", timeout=short)
    final = denseccl.init(backend="mpi", timeout=120)
    rank, size = comm_a.rank, comm_a.size
    skipper = size - 1
    check = Checker("timeouts", rank, size)
    check.check(comm_b.timeout == from_env, f"DENSECCL_TIMEOUT not used: {comm_b.timeout}")

    # (a) the skipper never calls allreduce on comm_a
    if rank != skipper:
        x = np.arange(6.0).reshape(2, 3).T
        expect_timeout(check, comm_a, "allreduce, init(timeout=)", short, lambda: comm_a.allreduce(x), [x])

    # (b) comm_b works, then the skipper leaves out a broadcast
    y = np.full(3, rank, np.int32)
    comm_b.allreduce(y)
    check.check(y.tolist() == [sum(range(size))] * 3, "comm_b allreduce before the skip")
    if rank != skipper:
        z = np.full(4, rank, np.float32)
        expect_timeout(check, comm_b, "broadcast, DENSECCL_TIMEOUT", from_env, lambda: comm_b.broadcast(z, 0), [z])

    # (c) the skipper leaves out a barrier
    if rank != skipper:
        expect_timeout(check, comm_c, "barrier, init(timeout=)", short, comm_c.barrier)

    # the skipper's peers gave up on each communicator and told it: no call of its may pair with
    # the abandoned ones, so each is broken here too
    final.barrier()
    if rank == skipper:
        for name, comm in (("comm_a", comm_a), ("comm_b", comm_b), ("comm_c", comm_c)):
            check.check(
                comm.broken is not None and "gave up" in comm.broken, f"skipper's {name}: broken = {comm.broken!r}"
            )
            try:
                comm.allreduce(np.zeros(2))
                check.fail(f"skipper's {name}: a call succeeded after its peers gave up")
            except denseccl.CommunicatorBrokenError:
                pass

    check.finish(hard_exit=True, before_exit=final.barrier)  # everyone reports, then waits for all before leaving


if __name__ == "__main__":
    main()
