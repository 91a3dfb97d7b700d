"""An allreduce within a host and across simulated hosts, denseccl and raw mpi4py, in one run
of alternating rounds (tests/hosts/ranks/allreduce_pairs.py on 2 hosts x 2 ranks).

usage (as root, from the checkout): .venv/bin/python -m tests.hosts.measure [ROUNDS ITERS [BYTES]]
(default: 7 rounds of 10 calls of 16 MiB)
"""

from __future__ import annotations

import sys
from pathlib import Path

from tests.hosts.simhosts import SimHosts, unavailable
from tests.support.checker import expect_summaries


def main(argv: list) -> int:
    settings = argv + ["7", "10", str(16 << 20)][len(argv):]
    reason = unavailable()
    if reason is not None:
        print(reason, file=sys.stderr)
        return 1
    program = Path(__file__).parent / "ranks" / "allreduce_pairs.py"
    with SimHosts(2) as hosts:
        done = hosts.mpiexec([str(program), *settings], hosts=2, per_host=2, timeout=600)
    print(done.outputs.get(0, done.stdout))
    expect_summaries(done.stdout, "allreduce_pairs", 4)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
