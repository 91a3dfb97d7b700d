"""Rank program of the GPU tests, on the NCCL backend.

usage: python tests/gpu/rank.py SCENARIO[,SCENARIO...]
  under a torchrun-style environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, LOCAL_RANK), or
  mpiexec, or alone (one rank). DENSECCL_SPLIT_HOSTS=1 gives each rank its own NCCL_HOSTID (and
  sockets on lo) before NCCL starts, so that two ranks may share one GPU.

scenarios: probe, matrix, mismatch, streams, split, faults (last: it leaves with os._exit),
hang1 (one rank: a stream blocked by a host function; last, os._exit).
Prints one JSON line per scenario; exits non-zero if any check failed.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Sequence

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def _split_hosts() -> None:
    if os.environ.get("DENSECCL_SPLIT_HOSTS") != "1":
        return
    for name in ("RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"):
        if os.environ.get(name):
            os.environ["NCCL_HOSTID"] = f"denseccl-rank{os.environ[name]}"
            break
    os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
    os.environ.setdefault("NCCL_IB_DISABLE", "1")


_split_hosts()

import numpy as np  # noqa: E402

import denseccl  # noqa: E402
from denseccl.errors import CollectiveTimeoutError, CommunicatorBrokenError, DenseCCLError, LayoutError, MismatchError  # noqa: E402
from tests.gpu import matrix  # noqa: E402
from tests.gpu.support import cupy_from_host, cupy_to_host, torch_cuda  # noqa: E402

FAILURES: list = []


def check(condition: bool, what: str) -> None:
    if not condition:
        FAILURES.append(what)


def watchdog_verdict(comm, started: float, limit: float, pause: float, what: str) -> None:
    """Wait (at most ``limit`` s after ``started``) until the watchdog marks ``comm`` broken,
    then check that it did so for a call that did not complete."""
    while comm.broken is None and time.monotonic() - started < limit:
        time.sleep(pause)
    check(comm.broken is not None and "did not complete" in comm.broken, f"{what}: watchdog verdict {comm.broken}")


RANK = [0]


def emit(scenario: str, **fields: object) -> None:
    print(json.dumps({"scenario": scenario, "rank": RANK[0], **fields}, default=str), flush=True)


def init(**options: object) -> denseccl.Communicator:
    if not os.environ.get("WORLD_SIZE") and not any(
        os.environ.get(v) for v in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")
    ):
        options.setdefault("size", 1)
    return denseccl.init(backend="nccl", **options)  # type: ignore[arg-type]


def init_short(seconds: float, **options: object) -> denseccl.Communicator:
    """A communicator whose calls time out after ``seconds``, made with room for NCCL's init and
    its first (lazy) connections, which over sockets on a shared GPU can take longer than that."""
    comm = init(timeout=60, **options)
    comm.timeout = seconds
    comm.transport.timeout = seconds
    comm.transport._watchdog.timeout = seconds  # the transport's watchdog reads it at each call
    return comm


def ones(n: int = 4, value: float = 1.0):
    return cupy_from_host(np.full(n, value, np.float32))


# -- scenarios --------------------------------------------------------------------------------


def probe(comm) -> None:
    x = ones()
    comm.allreduce(x)
    check(np.all(cupy_to_host(x) == comm.size), f"probe: {cupy_to_host(x)}")
    from cupy.cuda import nccl

    from denseccl.backends.nccl.tables import version_string

    emit("probe", ok=not FAILURES, size=comm.size, device=comm.transport.device,
         nccl=version_string(nccl.get_version()), hostid=os.environ.get("NCCL_HOSTID"))  # fmt: skip


def run_matrix(comm) -> None:
    from denseccl.backends.nccl.tables import FP8_SINCE

    started = time.monotonic()
    report = matrix.run_matrix(comm, matrix.device_libs(comm, fp8=comm.transport.version >= FP8_SINCE))
    FAILURES.extend(report.failures)
    emit("matrix", seconds=round(time.monotonic() - started, 1), **report.summary())


def mismatch(comm) -> None:
    import cupy

    rank = comm.rank
    base = np.arange(12, dtype=np.float32).reshape(3, 4)
    x = cupy_from_host(base if rank == 0 else np.ascontiguousarray(base.T).T)  # rank 0 C order, others F order
    before = cupy_to_host(x).copy()
    try:
        comm.allreduce(x)
        check(False, "mismatch: no MismatchError for different layouts")
    except MismatchError as error:
        check("layout" in str(error), f"mismatch: message {error}")
    check(np.array_equal(cupy_to_host(x), before), "mismatch: the buffer was touched")
    bad = cupy.ndarray((3, 2), np.float32, memptr=cupy.cuda.alloc(48), strides=(16, 4))  # gaps: not dense
    good = cupy_from_host(np.ones((3, 2), np.float32))
    try:
        comm.allreduce(bad if rank == 0 else good)
        check(False, "mismatch: no error for a non-dense input on rank 0")
    except LayoutError as error:
        check(rank == 0, f"mismatch: LayoutError on rank {rank}: {error}")
    except MismatchError as error:
        check(rank != 0 and "validation" in str(error), f"mismatch: {error}")
    y = ones()
    comm.allreduce(y)  # still usable
    check(np.all(cupy_to_host(y) == comm.size), "mismatch: communicator unusable afterwards")
    emit("mismatch", ok=not FAILURES)


class _Spy:
    """Wraps the NcclCommunicator to record the stream argument of every call."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.streams: list = []

    def __getattr__(self, name: str):
        attribute = getattr(self.inner, name)
        if name in ("allReduce", "reduce", "broadcast", "allGather", "reduceScatter"):

            def call(*args):
                self.streams.append(args[-1])
                return attribute(*args)

            return call
        return attribute


def streams(comm) -> None:
    import cupy

    spy = _Spy(comm.transport.comm)
    comm.transport.comm = spy
    try:
        size = comm.size
        side = cupy.cuda.Stream(non_blocking=True)
        x = ones(1 << 16, 2.0)
        with side:
            comm.allreduce(x)  # the current stream is `side`
        check(spy.streams[-1] == side.ptr, f"streams: ran on {spy.streams[-1]}, not the current stream {side.ptr}")
        side.synchronize()
        check(np.all(cupy_to_host(x) == 2.0 * size), "streams: values after a side-stream allreduce")
        other = cupy.cuda.Stream(non_blocking=True)
        work = comm.allreduce(x, "max", async_op=True, stream=other)
        check(spy.streams[-1] == other.ptr, "streams: stream= not used")
        result = work.wait()  # the current (null) stream now waits for `other`
        check(result is x, "streams: Work.wait result")
        check(np.all(cupy_to_host(x) == 2.0 * size), "streams: values after Work.wait")  # cudaMemcpy on the null stream
        check(work.is_completed(), "streams: is_completed after the host saw the result")
        work = comm.allgather(x, async_op=True)
        gathered = work.synchronize()
        check(gathered.shape == (size, x.size) and gathered.device.id == x.device.id, "streams: allgather result")
        torch = torch_cuda()
        if torch is not None:
            t = torch.full((5, 3), 1.0, device=f"cuda:{comm.transport.device}").t()  # transposed tensor
            ts = torch.cuda.Stream(device=t.device)
            ts.wait_stream(torch.cuda.current_stream(t.device))
            with torch.cuda.stream(ts):
                work = comm.allreduce(t, async_op=True)
                check(spy.streams[-1] == ts.cuda_stream, "streams: torch's current stream not used")
            work.wait()  # torch's current (default) stream waits for ts
            check(torch.all(t == size).item() and t.stride() == (1, 3), "streams: torch values or strides")
    finally:
        comm.transport.comm = spy.inner
    emit("streams", ok=not FAILURES)


def split(comm) -> None:
    rank, size = comm.rank, comm.size
    try:
        part = comm.split(0, key=-rank)
    except DenseCCLError as error:
        emit("split", ok=True, skipped=str(error))
        return
    check(part.size == size and part.rank == size - 1 - rank, f"split: rank {part.rank} of {part.size}")
    x = ones(8, float(rank + 1))
    part.allreduce(x)
    check(np.all(cupy_to_host(x) == size * (size + 1) / 2), "split: values")
    none = comm.split(None if rank == size - 1 else 1, key=0)
    check((none is None) == (rank == size - 1), "split: color None")
    for sub in (part, none):
        if sub is not None:
            sub.close()
    emit("split", ok=not FAILURES)


def _shared_store():
    from denseccl.backends import rendezvous

    return next(iter(rendezvous._STORES.values()), None)


def faults(comm) -> None:
    """Rank 0 meets three kinds of peer that never join; the other ranks stay alive (but idle)
    until rank 0 is done, so that NCCL sees a hang, not a closed connection."""
    rank = comm.rank
    agreement = init_short(3)
    hang = init_short(3, check="off")
    watched = init_short(3, check="off")
    xs = [ones() for _ in range(4)]
    store = _shared_store()
    if rank != 0:
        if store is not None:
            leave_together(store, rank, comm.size, "denseccl-test/faults")
        else:
            comm.control.allgather_bytes(b"", None)  # MPI: rank 0 reaches this when done
        emit("faults", ok=True)
        return
    started = time.monotonic()
    try:
        agreement.allreduce(xs[0])
        check(False, "faults: no CollectiveTimeoutError in the agreement step")
    except CollectiveTimeoutError:
        check(
            2.5 < time.monotonic() - started < 30, f"faults: agreement timeout after {time.monotonic() - started:.1f} s"
        )
    try:
        agreement.allreduce(xs[0])
        check(False, "faults: a timed-out communicator still works")
    except CommunicatorBrokenError:
        pass
    started = time.monotonic()
    work = hang.allreduce(xs[1], async_op=True)
    check(time.monotonic() - started < 2, "faults: enqueue blocked")
    try:
        work.synchronize()
        check(False, "faults: Work.synchronize returned for a collective a peer never joined")
    except CollectiveTimeoutError as error:
        check("aborted" in str(error), f"faults: {error}")
        check(2.5 < time.monotonic() - started < 30, f"faults: NCCL timeout after {time.monotonic() - started:.1f} s")
    check(hang.broken is not None, "faults: not broken after a timeout")
    started = time.monotonic()
    watched.allreduce(xs[2])  # synchronous call: returns at once, the GPU waits
    check(time.monotonic() - started < 2, "faults: a synchronous call blocked the host")
    watchdog_verdict(watched, started, 30, 0.1, "faults")
    try:
        watched.allreduce(xs[3])
        check(False, "faults: the watchdog-aborted communicator still works")
    except (CommunicatorBrokenError, CollectiveTimeoutError):
        pass
    emit("faults", ok=not FAILURES, watchdog=watched.broken)
    if store is not None:
        leave_together(store, rank, comm.size, "denseccl-test/faults")
    else:
        comm.control.allgather_bytes(b"", None)


def leave_together(store: Any, rank: int, size: int, name: str, timeout: float = 60.0) -> None:
    """The end of a scenario whose ranks then exit at once: rank 0, whose process serves the
    TCPStore, says it is done and waits until every peer has seen that before it may exit.
    ``TCPStore.set`` returns without a reply, and a server that exits right after it resets the
    connection of a peer whose ``wait`` was not answered yet (that peer then fails with a
    network error). A peer's last word is a ``set`` too: it needs no answer from a server that
    may be gone by then (an ``add`` would wait for one)."""
    from datetime import timedelta

    if rank == 0:
        store.set(f"{name}-done", b"1")
        peers = [f"{name}-left/{peer}" for peer in range(1, size)]
        try:
            store.wait(peers, timedelta(seconds=timeout))
        except Exception as error:  # noqa: BLE001 - a peer that died: say so, exit anyway
            FAILURES.append(f"{name}: the peers did not all leave within {timeout:g} s: {error}")
    else:
        store.wait([f"{name}-done"], timedelta(seconds=timeout))
        store.set(f"{name}-left/{rank}", b"1")


HANG_GATE = 5.0  # seconds a host function blocks a stream (ncclCommAbort waits for it)


#: what the one-rank fault scenarios run: NCCL launches a kernel for it even with one rank
PREMUL = denseccl.PreMulSum(2.0)


def hang_scenario(
    first: Any, second: Any, xs: Sequence[Any], streams: Sequence[Any], block: Callable[[int, float], Any],
    gate: float = HANG_GATE, order: str = "after_abort", verdict_within: float = 20, host_bound: float = 1.0,
) -> None:
    """Two one-rank communicators whose streams are blocked by a host function (``block(i,
    seconds)`` blocks ``streams[i]`` and returns a threading.Event that unblocks it), standing in
    for a peer that never comes: ``first`` times out in Work.synchronize, ``second`` by its
    watchdog. ncclCommAbort frees device memory, which waits for the whole device, so the first
    abort returns only once every stream then blocked is released: the second stream is
    therefore blocked only after the first abort has returned (``order="together"``, both at
    the start, is the order that failed: the first abort released the second call too).
    The calls are PreMulSums: with one rank NCCL enqueues a kernel for them on the caller's
    stream (onerank.cu), where an in-place sum enqueues nothing at all, so a real NCCL kernel
    is in flight behind the host function, not only denseccl's event."""
    gates = [block(0, gate)]
    if order == "together":
        gates.append(block(1, gate))
    try:
        started = time.monotonic()
        work = first.allreduce(xs[0], PREMUL, async_op=True, stream=streams[0])
        check(not work.is_completed(), "hang1: completed behind a blocked stream")  # (wait() marks it done)
        work.wait()  # makes the current stream wait: must not block the host
        check(time.monotonic() - started < host_bound, "hang1: Work.wait blocked the host")
        try:
            work.synchronize(timeout=1.0)
            check(False, "hang1: no CollectiveTimeoutError")
        except CollectiveTimeoutError as error:
            check("aborted" in str(error), f"hang1: {error}")
        check(first.broken is not None, "hang1: not broken")
        if order != "together":
            gates.append(block(1, 4 * gate))  # longer than any abort of this scenario takes
        started = time.monotonic()
        second.allreduce(xs[1], PREMUL, stream=streams[1])
        check(time.monotonic() - started < host_bound, "hang1: a synchronous call blocked the host")
        watchdog_verdict(second, started, verdict_within, 0.05, "hang1")
    finally:
        for opened in gates:
            opened.set()


def hang1(comm) -> None:
    """One rank: a stream blocked by a host function stands in for a peer that never comes."""
    import cupy

    streams = [cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)]

    def block(index: int, seconds: float) -> threading.Event:
        gate = threading.Event()
        streams[index].launch_host_func(lambda gate: gate.wait(seconds), gate)
        return gate

    hang_scenario(init(timeout=2), init(timeout=1.5), [ones(), ones()], streams, block)
    emit("hang1", ok=not FAILURES, in_flight="a PreMulSum kernel (NCCL's one-rank path) behind a host function")


SCENARIOS = {
    "probe": probe, "matrix": run_matrix, "mismatch": mismatch, "streams": streams, "split": split, "faults": faults,
    "hang1": hang1,
}


def main() -> None:
    names = sys.argv[1].split(",") if len(sys.argv) > 1 else ["probe"]
    comm = init(timeout=120)
    RANK[0] = comm.rank
    for name in names:
        try:
            SCENARIOS[name](comm)
        except Exception as error:  # noqa: BLE001
            FAILURES.append(f"{name}: {type(error).__name__}: {error}\n{traceback.format_exc()}")
            emit(name, ok=False, error=f"{type(error).__name__}: {error}")
    for failure in FAILURES[:30]:
        print("FAILED:", failure, flush=True)
    code = 1 if FAILURES else 0
    if any(name in ("faults", "hang1") for name in names):
        sys.stdout.flush()
        os._exit(code)  # aborted communicators: skip teardown
    comm.close()
    sys.exit(code)


if __name__ == "__main__":
    main()
