"""``python -m denseccl.bench.recorder_hook``: what the flight recorder's hook costs one call, in
one process, apart from any peer (the full benchmark measures it on ranks: ``--recorder off,on``).

Two communicators of one rank (an MPI singleton, or ``launch/run -n 1``), one with the recorder
and one without, run the same repeated in-place 4 KiB allreduce (the prepared-call path of
:meth:`Flow.run`) in alternating rounds; each round's time per call is the mean over
``--calls`` calls, and the row reports the median round of each and their difference. A
communicator of one rank runs no agreement step, so there the recorder also pays the clock
read that on more ranks it shares with the agreement's deadline; that read is timed alone
and taken off for the last line, the hook's cost where the agreement runs (the board path).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from functools import partial
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np


def per_call(step: Callable[[], Any], calls: int) -> float:
    """Seconds per call of ``step`` over ``calls`` calls."""
    began = time.perf_counter()
    for _ in range(calls):
        step()
    return (time.perf_counter() - began) / calls


def communicator(recorder: bool) -> Any:
    """A one-rank MPI communicator with or without the flight recorder."""
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


def measure(calls: int, rounds: int, nbytes: int) -> Dict[str, float]:
    """Median seconds per call: ``off``, ``on`` (the recorder), ``clock`` (one time.monotonic())."""
    comms = {name: communicator(name == "on") for name in ("off", "on")}
    arrays = {name: np.ones(nbytes // 4, np.float32) for name in comms}
    steps: Dict[str, Callable[[], Any]] = {name: partial(comms[name].allreduce, arrays[name]) for name in comms}
    steps["clock"] = time.monotonic
    for step in steps.values():  # warm-up: the calls are prepared on their first run
        per_call(step, calls // 10 + 1)
    times: Dict[str, List[float]] = {name: [] for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            times[name].append(per_call(step, calls))
    recorded = comms["on"].flow.recorder
    assert recorded is not None and recorded.count > calls * rounds and comms["off"].flow.recorder is None
    for comm in comms.values():
        comm.close()
    return {name: statistics.median(values) for name, values in times.items()}


def main(argv: Optional[Sequence[str]] = None) -> int:
    prog = "python -m denseccl.bench.recorder_hook"
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20000, help="calls per round (default 20000)")
    parser.add_argument("--rounds", type=int, default=21, help="alternating rounds (default 21)")
    parser.add_argument("--bytes", type=int, default=4096, help="allreduce size in bytes (default 4096)")
    args = parser.parse_args(argv)
    found = measure(args.calls, args.rounds, args.bytes)
    off, on, clock = found["off"] * 1e9, found["on"] * 1e9, found["clock"] * 1e9
    print(f"# {args.bytes} B float32 allreduce, 1 rank, {args.rounds} rounds x {args.calls} calls (medians)")
    print(f"recorder off      {off:8.1f} ns per call")
    print(f"recorder on       {on:8.1f} ns per call   (+{on - off:.1f} ns, {on / off:.4f}x)")
    print(f"clock read        {clock:8.1f} ns")
    print(f"hook, clock shared with the deadline (ranks > 1, check on): {on - off - clock:+.1f} ns per call")
    return 0


if __name__ == "__main__":
    sys.exit(main())
