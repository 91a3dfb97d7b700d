"""One rank of the store control-channel test (run by test_nccl_store.py as a subprocess).

usage: store_rank.py PORT RANK SIZE SCENARIO[,SCENARIO...]  (timeout last: the last rank leaves)
Connects to a TCPStore served by the test process and exits non-zero if a check fails.
"""

from __future__ import annotations

import json
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from torch.distributed import TCPStore

from denseccl.agreement import Descriptor, agree
from denseccl.errors import CollectiveTimeoutError, LayoutError, MismatchError
from denseccl.backends.store import StoreControl


def deadline(seconds: float = 30.0) -> float:
    return time.monotonic() + seconds


def exchanges(control: StoreControl, store: TCPStore) -> None:
    rank, size = control.rank, control.size
    for step in range(150):
        values = [rank * 1000 + step, -rank, step]
        assert control.allreduce_max(values, deadline()) == [(size - 1) * 1000 + step, 0, step]
        data = bytes([rank]) * (rank + step % 3)  # lengths differ by rank, some empty
        gathered = control.allgather_bytes(data, deadline())
        assert gathered == [bytes([r]) * (r + step % 3) for r in range(size)], gathered
    # at most two exchanges' keys per rank remain
    assert store.num_keys() <= 2 * size + 2, store.num_keys()


def agreement(control: StoreControl) -> None:
    key = ("float32", (4, 3), (1, 4))
    agree(control, Descriptor("allreduce", None, "sum", key), deadline())
    mine = ("float32", (4, 3), (3, 1) if control.rank == 1 else (1, 4))
    try:
        agree(control, Descriptor("allreduce", None, "sum", mine), deadline())
    except MismatchError as error:
        text = str(error)
        assert "mismatch" in text and "layout" in text and "rank 1" in text, text
    else:
        raise AssertionError("no MismatchError")
    invalid = LayoutError("not dense") if control.rank == 2 else None
    try:
        agree(control, Descriptor("allreduce", None, "sum", key if invalid is None else None), deadline(), invalid)
    except LayoutError:
        assert control.rank == 2
    except MismatchError as error:
        assert control.rank != 2 and "failed validation" in str(error), str(error)
    else:
        raise AssertionError("no error")
    agree(control, Descriptor("barrier"), deadline())  # still usable


def split(control: StoreControl) -> None:
    rank = control.rank
    color = None if rank == 1 else rank % 2
    part = control.split(color, -rank, deadline())
    if color is None:
        assert part is None
    else:
        members = [r for r in range(control.size) if r != 1 and r % 2 == color]
        assert part.size == len(members)
        assert part.rank == sorted(members, reverse=True).index(rank)  # key -rank reverses the order
        gathered = part.allgather_bytes(str(rank).encode(), deadline())
        assert [int(g) for g in gathered] == sorted(members, reverse=True)
    control.allreduce_max([1], deadline())  # the parent still works after the split


def timeout(control: StoreControl) -> None:
    control.allreduce_max([control.rank], deadline())
    if control.rank == control.size - 1:
        return  # never joins the next exchange
    started = time.monotonic()
    try:
        control.allreduce_max([0], time.monotonic() + 1.5)
    except CollectiveTimeoutError as error:
        elapsed = time.monotonic() - started
        assert 1.4 < elapsed < 20, elapsed
        assert "timeout" in str(error), str(error)
    else:
        raise AssertionError("no CollectiveTimeoutError")


def main() -> None:
    port, rank, size, scenarios = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    store = TCPStore("127.0.0.1", port, size + 1, False, timeout=timedelta(seconds=60))
    for scenario in scenarios.split(","):
        control = StoreControl(store, rank, size, f"test/{scenario}")
        {
            "exchanges": lambda: exchanges(control, store),
            "agreement": lambda: agreement(control),
            "split": lambda: split(control),
            "timeout": lambda: timeout(control),
        }[scenario]()
        print(json.dumps({"rank": rank, "scenario": scenario, "ok": True}), flush=True)


if __name__ == "__main__":
    main()
