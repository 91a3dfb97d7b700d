"""``python -m denseccl.bench.gloo_calls``: how each small call of the gloo engine is spent, with
the agreement step on and off, against torch's gloo, side by side in one job::

    torchrun --standalone --nproc-per-node 2 -m denseccl.bench.gloo_calls [--kib 4] [--blocks 20] [--calls 150]

Contenders, on the same ranks and the same number of bytes: ``check`` (``denseccl.init()``'s
communicator, the agreement on the host's board; up to ``DENSECCL_HOST_PATH`` bytes the call
itself then moves through the host's shared memory, backends/shm), ``off`` (a second
communicator with ``check="off"``: the same engine with no agreement step) and ``gloo`` (``dist.all_reduce`` on a
gloo group). They alternate block by block, all ranks starting each block together. Every call
is timed on its own: a mean alone hides that on a small machine gloo's calls fall into two
groups, the usual ones and those that waited out a scheduler slice, so the table shows the
median, the 90th percentile, the share of calls over ``--slow`` ms, and the mean per call
(ratios: the means to gloo's). docs/performance-agreement.md has the figures and what they show.
"""

from __future__ import annotations

import argparse
import time
from typing import Any, Callable, Dict, List

import numpy as np


def main(argv: Any = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kib", type=float, default=4.0, help="KiB per call (float32)")
    parser.add_argument("--blocks", type=int, default=20, help="blocks per contender")
    parser.add_argument("--calls", type=int, default=150, help="calls per block")
    parser.add_argument("--slow", type=float, default=2.0, help="a call over this many ms counts as slow")
    args = parser.parse_args(argv)

    import torch  # noqa: PLC0415
    import torch.distributed as dist  # noqa: PLC0415

    import denseccl  # noqa: PLC0415

    checked = denseccl.init(check="always")
    unchecked = denseccl.init(check="off")
    dist.init_process_group("gloo")
    count = max(int(args.kib * 1024) // 4, 1)
    x, y, t = np.ones(count, np.float32), np.ones(count, np.float32), torch.ones(count)
    contenders: Dict[str, Callable[[], Any]] = {
        "check": lambda: checked.allreduce(x),
        "off": lambda: unchecked.allreduce(y),
        "gloo": lambda: dist.all_reduce(t),
    }
    times: Dict[str, List[float]] = {name: [] for name in contenders}
    stamps = np.empty(args.calls + 1, np.float64)
    for block in range(args.blocks):
        for name in list(contenders)[block % 3:] + list(contenders)[: block % 3]:
            step = contenders[name]
            dist.barrier()
            stamps[0] = time.perf_counter()
            for i in range(1, args.calls + 1):
                step()
                stamps[i] = time.perf_counter()
            times[name].extend(np.diff(stamps) * 1e3)
    gathered: List[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, times)
    if dist.get_rank() == 0:
        # a call's time is its slowest rank's: the ranks' i-th calls are one collective
        rows = {name: np.max([np.asarray(every[name]) for every in gathered], axis=0) for name in contenders}
        gloo = rows["gloo"].mean()
        print(f"# {args.kib:g} KiB float32 allreduce, {dist.get_world_size()} ranks, {args.blocks} blocks x "
              f"{args.calls} calls each, alternating; ms per call (slowest rank)")
        print(f"#        median     p90   slow(>{args.slow:g} ms)    mean   mean/gloo")
        for name, row in rows.items():
            slow = 100 * (row > args.slow).mean()
            print(f"{name:6s} {np.median(row):8.3f} {np.percentile(row, 90):7.3f} {slow:9.1f}% "
                  f"{row.mean():10.3f} {row.mean() / gloo:8.2f}")
    checked.close()
    unchecked.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
