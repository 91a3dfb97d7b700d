"""One rank of tests/unit/test_gpu_harness.py's store test: rank 0 serves a TCPStore and ends
as tests/gpu/rank.py's ``faults`` scenario does, with os._exit right after; rank 1 waits there.

usage: store_leave_rank.py 0            (prints the port it serves, then ends)
       store_leave_rank.py 1 PORT       (exit 0 once it has seen rank 0's end, 1 on an error)
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from torch.distributed import TCPStore

from tests.gpu.rank import FAILURES, leave_together


def main() -> None:
    rank = int(sys.argv[1])
    if rank == 0:
        store = TCPStore("127.0.0.1", 0, 2, True, timedelta(seconds=60), wait_for_workers=False)
        print(store.port, flush=True)
        store.wait(["ready"])  # rank 1 waits for the end from now on
    else:
        store = TCPStore("127.0.0.1", int(sys.argv[2]), 2, False, timedelta(seconds=60))
        store.add("ready", 1)
    try:
        leave_together(store, rank, 2, "faults")
    except Exception as error:  # noqa: BLE001
        print(f"rank {rank}: {type(error).__name__}: {error}", flush=True)
        os._exit(1)
    print(f"rank {rank}: left{' ' + '; '.join(FAILURES) if FAILURES else ''}", flush=True)
    os._exit(1 if FAILURES else 0)  # as rank.py does after faults: no teardown


if __name__ == "__main__":
    main()
