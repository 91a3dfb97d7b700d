"""``python -m denseccl.bench.recorder_hook``: what the flight recorder costs a call, recorder on
against off side by side in one job, with statistics that survive a machine others load.

Run under an MPI launcher (``launch/run -n 2 python -m denseccl.bench.recorder_hook``; one rank
also works). Four communicators, ``off`` and ``off2`` (no recorder) and ``on`` and ``on2`` (the
recorder; the spread between ``off`` and ``off2`` is the noise floor), run the same
repeated in-place allreduce (4 KiB float32: the prepared-call path of :meth:`Flow.run`, on more
ranks than one through the agreement step, the board under mpiexec) in short blocks, all ranks
starting each block together, the order reversed every block. Each block's time per call is
its mean; rank 0 prints each contender's minimum, 10th percentile and median block and their
ratios to ``off``. On a loaded host the low percentiles are the ones to read: a block that
another job interrupted says nothing about the recorder.

Which communicator a call runs on moves its time by itself (up to +-40 ns here with all of them
off: each has its own board page and objects), so there are two of each, made in the order
off, on, off2, on2, and the ``pooled`` line compares the two with the recorder against the two
without (each quantile the mean of the pair's): the recorder's cost with that bias halved.

On one rank there is no agreement step, so there the recorder also pays a clock read that on
more ranks it shares with the agreement's deadline; the ``clock`` line times that read alone.
The full benchmark measures the same with ``python -m denseccl.bench --recorder off,on``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from functools import partial
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

#: the contenders: name -> whether it has the recorder
CONTENDERS = {"off": False, "on": True, "off2": False, "on2": True}


def per_call(step: Callable[[], Any], calls: int) -> float:
    """Seconds per call of ``step`` over ``calls`` calls."""
    began = time.perf_counter()
    for _ in range(calls):
        step()
    return (time.perf_counter() - began) / calls


def communicator(recorder: bool) -> Any:
    """An MPI communicator of the job with or without the flight recorder (collective)."""
    import denseccl  # noqa: PLC0415

    saved = os.environ.get("DENSECCL_TRACE_BUFFER")
    os.environ["DENSECCL_TRACE_BUFFER"] = "1024" if recorder else "0"
    try:
        return denseccl.init(backend="mpi")
    finally:
        if saved is None:
            os.environ.pop("DENSECCL_TRACE_BUFFER", None)
        else:
            os.environ["DENSECCL_TRACE_BUFFER"] = saved


def measure(calls: int, blocks: int, nbytes: int) -> Dict[str, List[float]]:
    """Seconds per call of every block, per contender (and ``clock``: one time.monotonic())."""
    from mpi4py import MPI  # noqa: PLC0415

    world = MPI.COMM_WORLD
    comms = {name: communicator(recorded) for name, recorded in CONTENDERS.items()}
    steps: Dict[str, Callable[[], Any]] = {
        name: partial(comm.allreduce, np.ones(nbytes // 4, np.float32)) for name, comm in comms.items()
    }
    for step in steps.values():  # the first call prepares the repeated one
        per_call(step, 100)
    times: Dict[str, List[float]] = {name: [] for name in [*steps, "clock"]}
    order = list(steps)
    for block in range(blocks):
        for name in order if block % 2 == 0 else order[::-1]:
            world.Barrier()
            times[name].append(per_call(steps[name], calls))
        times["clock"].append(per_call(time.monotonic, calls))
    recorder = comms["on"].flow.recorder
    assert recorder is not None and recorder.count >= calls * blocks and comms["off"].flow.recorder is None
    for comm in comms.values():
        comm.close()
    return times


def quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[round(q * (len(ordered) - 1))]


def report(times: Dict[str, List[float]], ranks: int, calls: int, nbytes: int) -> List[str]:
    """The lines rank 0 prints: per contender its min / 10th percentile / median block (us),
    each as a ratio to ``off`` and as the difference in ns."""
    blocks = len(times["off"])
    lines = [f"# {nbytes} B float32 allreduce, {ranks} rank(s), {blocks} blocks x {calls} calls, alternating"]
    lines.append(f"# {'':6} {'min':>9} {'p10':>9} {'median':>9}   (us per call; ratio to off, difference)")
    base = {q: quantile(times["off"], q) for q in (0.0, 0.1, 0.5)}
    for name in CONTENDERS:
        cells = [quantile(times[name], q) for q in (0.0, 0.1, 0.5)]
        ratios = "  ".join(
            f"{q:>4}: {cell / base[key]:.4f} ({(cell - base[key]) * 1e9:+.0f} ns)"
            for q, key, cell in zip(("min", "p10", "med"), (0.0, 0.1, 0.5), cells)
        )
        lines.append(f"{name:8} {cells[0] * 1e6:9.3f} {cells[1] * 1e6:9.3f} {cells[2] * 1e6:9.3f}   {ratios}")
    pairs = {side: [sum(quantile(times[name], q) for name in names) / 2 for q in (0.0, 0.1, 0.5)]
             for side, names in (("on", ("on", "on2")), ("off", ("off", "off2")))}
    pooled = "  ".join(
        f"{q:>4}: {on / off:.4f} ({(on - off) * 1e9:+.0f} ns)"
        for q, on, off in zip(("min", "p10", "med"), pairs["on"], pairs["off"])
    )
    lines.append(f"pooled   {'':29}   {pooled}   (on+on2 against off+off2)")
    lines.append(f"clock    {quantile(times['clock'], 0.0) * 1e9:9.1f} ns (one time.monotonic(), min)")
    return lines


def main(argv: Optional[Sequence[str]] = None) -> int:
    prog = "python -m denseccl.bench.recorder_hook"
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=200, help="calls per block (default 200)")
    parser.add_argument("--blocks", type=int, default=300, help="blocks per contender (default 300)")
    parser.add_argument("--bytes", type=int, default=4096, help="allreduce size in bytes (default 4096)")
    args = parser.parse_args(argv)
    from mpi4py import MPI  # noqa: PLC0415

    times = measure(args.calls, args.blocks, args.bytes)
    if MPI.COMM_WORLD.Get_rank() == 0:
        print("\n".join(report(times, MPI.COMM_WORLD.Get_size(), args.calls, args.bytes)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
