"""Rank program: async_op=True returns a Work; is_completed() becomes True; wait() returns the
result; several outstanding Works are completed in different orders on different ranks.

usage: mpiexec -n N python async_ops.py [--torch]
"""

from __future__ import annotations

import sys
import time

import numpy as np

import denseccl
from tests.mpi.ranks.common import to_numpy
from tests.support.checker import Checker


def main() -> None:
    use_torch = "--torch" in sys.argv[1:]
    if use_torch:
        import torch
    comm = denseccl.init(backend="mpi", timeout=30)
    rank, size = comm.rank, comm.size
    check = Checker("async", rank, size)
    root = size - 1

    def v(r, shape, dtype=np.float64):
        return (np.arange(int(np.prod(shape))).reshape(shape) + 10 * r).astype(dtype)

    for round_ in range(3):
        a = v(rank, (3, 4)).T  # transposed
        b = v(rank, (2, 3), np.int32)[:, ::-1]  # flipped
        c = np.stack([v(rank, (2, 2), np.int64) * (k + 1) for k in range(size)])  # stacked
        d = v(rank, (5,), np.float32)
        e = v(rank, (1, 4, 1), np.int16)
        if use_torch and round_ == 2:
            a = torch.from_numpy(np.ascontiguousarray(v(rank, (3, 4)))).t()  # torch tensors too
        works = {
            "allreduce": comm.allreduce(a, "sum", async_op=True),
            "allgather": comm.allgather(b, async_op=True),
            "reduce_scatter": comm.reduce_scatter(c, "avg", async_op=True),
            "reduce": comm.reduce(d, root, "max", async_op=True),
            "broadcast": comm.broadcast(e, root, async_op=True),
        }
        for name, work in works.items():
            check.check(isinstance(work, denseccl.Work), f"{name}: async_op=True returned {type(work).__name__}")

        # completion order differs by rank and by round
        names = list(works)
        order = names[(rank + round_) % len(names):] + names[: (rank + round_) % len(names)]
        if rank % 2:
            order.reverse()
        results = {}
        for position, name in enumerate(order):
            work = works[name]
            if position % 2:  # poll is_completed() until true, then wait()
                started = time.monotonic()
                while not work.is_completed():
                    if time.monotonic() - started > 30:
                        check.fail(f"{name}: is_completed() never became true")
                        break
                    time.sleep(0.0005)
            results[name] = work.wait()
            check.check(work.is_completed(), f"{name}: not completed after wait()")
            check.check(work.wait() is results[name], f"{name}: a second wait() returned something else")

        check.check(results["allreduce"] is a, "allreduce: in-place result is not x")
        check.check(
            np.array_equal(to_numpy(a), sum(v(r, (3, 4)) for r in range(size)).T), f"round {round_}: allreduce values"
        )
        gathered = results["allgather"]
        check.check(
            all(np.array_equal(gathered[r], v(r, (2, 3), np.int32)[:, ::-1]) for r in range(size)), "allgather values"
        )
        total = sum(v(r, (2, 2), np.int64) for r in range(size)) * (rank + 1)
        check.check(
            np.array_equal(results["reduce_scatter"], np.sign(total) * (np.abs(total) // size)), "reduce_scatter avg"
        )
        check.check(results["reduce"] is d, "reduce: result is not x")
        if rank == root:
            check.check(np.array_equal(d, v(size - 1, (5,), np.float32)), "reduce max on root")
        else:
            check.check(np.array_equal(d, v(rank, (5,), np.float32)), "reduce: non-root input changed")
        check.check(results["broadcast"] is e and np.array_equal(e, v(root, (1, 4, 1), np.int16)), "broadcast values")

    # an outstanding Work does not block a synchronous collective issued after it
    w = comm.allreduce(np.ones(1000), async_op=True)
    x = np.full(3, rank, np.int64)
    comm.allreduce(x)
    check.check(x.tolist() == [sum(range(size))] * 3, "sync allreduce behind an async one")
    check.check(bool(np.all(w.wait() == size)), "the async one")
    check.check(comm.broken is None, f"broken: {comm.broken}")

    dropped_works(comm, check)
    waited_in_different_places(comm, check)
    split_between_async_calls(comm, check)
    check.finish()


def split_between_async_calls(comm: "denseccl.Communicator", check: Checker) -> None:
    """A synchronous float16 allreduce over the split threshold runs as reduce-scatter then
    allgather, issued in program order, while an async one issued before it is polled on some
    ranks only, at moments that differ per rank."""
    import random

    from denseccl.backends.mpi import transport as mpi_transport

    rank, size = comm.rank, comm.size
    jitter = random.Random(rank)
    splits = []
    real = mpi_transport.MPITransport._split_halves

    def counted(self, count, dtype):  # type: ignore[no-untyped-def]
        split = real(self, count, dtype)
        splits.append(split)
        return split

    mpi_transport.MPITransport._split_halves = counted
    total = size * (size + 1) / 2
    try:
        for iteration in range(20):
            a = np.full(1 << 20, rank + 1, np.float16)
            b = np.full((1 << 19) + 3, 10 * (rank + 1), np.float16)
            work = comm.allreduce(a, async_op=True)
            if jitter.random() < 0.5:
                until = time.monotonic() + jitter.random() * 0.003
                while time.monotonic() < until:
                    work.is_completed()
            comm.allreduce(b, "avg" if iteration % 2 else "sum")
            work.wait()
            want_b = 10 * total / size if iteration % 2 else 10 * total
            if not (np.all(a == total) and np.all(b == np.float16(want_b))):
                check.fail(
                    f"split between async calls, iteration {iteration}: {a[:2]} {b[:2]} (want {total}, {want_b})"
                )
                break
    finally:
        mpi_transport.MPITransport._split_halves = real
    check.check(any(splits), "the synchronous float16 allreduce never took the split path")


def waited_in_different_places(comm: "denseccl.Communicator", check: Checker) -> None:
    """Legal MPI orders that wait for an outstanding Work at different points on different
    ranks. Rank 0 waits for it (or polls it) first; the others first run the next collective,
    whose agreement step must keep MPI progressing their share of the outstanding one. Half
    types too: their reduction runs in denseccl's MPI user op."""
    rank, size = comm.rank, comm.size
    for dtype, n, poll in ((np.float32, 1 << 20, False), (np.float16, 1 << 20, True), (np.float32, 1024, True)):
        big = np.full(n, rank + 1, dtype)
        small = np.full(4, rank + 1, np.float32)
        work = comm.allreduce(big, async_op=True)
        try:
            if rank == 0:
                if poll:
                    started = time.monotonic()
                    while not work.is_completed() and time.monotonic() - started < 30:
                        pass
                work.wait()
                comm.allreduce(small)
            else:
                comm.allreduce(small)
                work.wait()
        except denseccl.DenseCCLError as error:
            check.fail(f"{np.dtype(dtype).name} x{n}, waited in different places: {type(error).__name__}: {error}")
            return
        total = size * (size + 1) / 2
        check.check(bool(np.all(big == total)) and bool(np.all(small == total)),
                    f"{np.dtype(dtype).name} x{n}, waited in different places: {big[:2]}, {small[:2]}")


def dropped_works(comm: "denseccl.Communicator", check: Checker) -> None:
    """A Work dropped without wait() still completes: the communicator keeps it, with the
    temporaries its request reads, until it has; close() completes it (the avg division
    included). Rank 0 joins late, so the others' requests are in flight when they drop them."""
    import gc

    rank, size = comm.rank, comm.size
    sub = comm.split(0, rank)  # a communicator to close while its Works are outstanding
    n = 1 << 16
    averaged = np.full(n, float(rank + 1))
    scaled_input = np.full(n, float(rank + 1))
    scaled_input.flags.writeable = False  # PreMulSum on a read-only input: scaled into a temporary
    received = np.zeros(n)
    if rank == 0:
        time.sleep(0.3)
    sub.allreduce(averaged, "avg", async_op=True)
    work = sub.reduce(scaled_input if rank else received, 0, denseccl.PreMulSum(0.5), out=received, async_op=True)
    del work
    gc.collect()
    litter = [np.full(n, -7.0) for _ in range(64)]  # reuse any memory the dropped Works freed
    outstanding = len(sub.flow.orphans)
    check.check(rank == 0 or outstanding >= 1, f"dropped Works adopted by the communicator: {outstanding}")
    sub.close()
    del litter
    expected = sum(range(1, size + 1)) / size
    check.check(
        bool(np.all(averaged == expected)), f"dropped async avg after close(): {averaged[:3]}, expected {expected}"
    )
    if rank == 0:
        total = 0.5 * sum(range(2, size + 1))  # rank 0 contributed zeros (received)
        check.check(
            bool(np.all(received == total)), f"dropped PreMulSum reduce on the root: {received[:3]}, expected {total}"
        )
    check.check(not sub.flow.orphans, "close() left dropped Works behind")


if __name__ == "__main__":
    main()
