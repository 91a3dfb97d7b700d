"""One rank of the store control-channel test (run by test_nccl_store.py as a subprocess).

usage: store_rank.py PORT RANK SIZE SCENARIO[,SCENARIO...]  (timeout last: the last rank leaves)
Connects to a TCPStore served by the test process; prints its summary (tests/support/checker.py)
and exits non-zero if a check failed.
"""

from __future__ import annotations

import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from torch.distributed import TCPStore

from denseccl.agreement import Descriptor, agree
from denseccl.errors import CollectiveTimeoutError, LayoutError, MismatchError
from denseccl.backends.store import StoreControl
from tests.support.checker import Checker


def deadline(seconds: float = 30.0) -> float:
    return time.monotonic() + seconds


def exchanges(check: Checker, control: StoreControl, store: TCPStore) -> None:
    rank, size = control.rank, control.size
    for step in range(150):
        values = [rank * 1000 + step, -rank, step]
        got = control.allreduce_max(values, deadline())
        check.check(got == [(size - 1) * 1000 + step, 0, step], f"allreduce_max step {step}: {got}")
        data = bytes([rank]) * (rank + step % 3)  # lengths differ by rank, some empty
        gathered = control.allgather_bytes(data, deadline())
        check.check(
            gathered == [bytes([r]) * (r + step % 3) for r in range(size)], f"allgather step {step}: {gathered}"
        )
    # at most two exchanges' keys per rank remain
    check.check(store.num_keys() <= 2 * size + 2, f"{store.num_keys()} keys left in the store")


def agreement(check: Checker, control: StoreControl) -> None:
    key = ("float32", (4, 3), (1, 4))
    agree(control, Descriptor("allreduce", None, "sum", key), deadline())
    mine = ("float32", (4, 3), (3, 1) if control.rank == 1 else (1, 4))
    error = check.raises(
        "a layout mismatch",
        MismatchError,
        lambda: agree(control, Descriptor("allreduce", None, "sum", mine), deadline()),
    )
    text = str(error)
    check.check(
        "mismatch" in text and "layout" in text and "rank 1" in text, f"the mismatch names no layout, rank 1: {text}"
    )
    invalid = LayoutError("not dense") if control.rank == 2 else None
    check.raises(
        "an invalid layout on rank 2",
        LayoutError if control.rank == 2 else MismatchError,
        lambda: agree(
            control, Descriptor("allreduce", None, "sum", key if invalid is None else None), deadline(), invalid
        ),
        "" if control.rank == 2 else "failed validation",
    )
    agree(control, Descriptor("barrier"), deadline())  # still usable


def split(check: Checker, control: StoreControl) -> None:
    rank = control.rank
    color = None if rank == 1 else rank % 2
    part = control.split(color, -rank, deadline())
    if color is None:
        check.check(part is None, f"color None gave {part}")
    else:
        members = sorted((r for r in range(control.size) if r != 1 and r % 2 == color), reverse=True)
        # key -rank reverses the order
        check.check(
            (part.size, part.rank) == (len(members), members.index(rank)), f"size {part.size}, rank {part.rank}"
        )
        gathered = part.allgather_bytes(str(rank).encode(), deadline())
        check.check([int(g) for g in gathered] == members, f"allgather in the part: {gathered}")
    check.check(control.allreduce_max([1], deadline()) == [1], "the parent after the split")


def timeout(check: Checker, control: StoreControl) -> None:
    got = control.allreduce_max([control.rank], deadline())
    check.check(got == [control.size - 1], f"allreduce_max before the timeout: {got}")
    if control.rank == control.size - 1:
        return  # never joins the next exchange
    started = time.monotonic()
    check.raises(
        "an exchange the last rank never joins",
        CollectiveTimeoutError,
        lambda: control.allreduce_max([0], time.monotonic() + 1.5),
        "timeout",
    )
    elapsed = time.monotonic() - started
    check.check(1.4 < elapsed < 20, f"timed out after {elapsed:.1f} s, not soon after the 1.5 s deadline")


def main() -> None:
    port, rank, size, scenarios = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    store = TCPStore("127.0.0.1", port, size + 1, False, timeout=timedelta(seconds=60))
    check = Checker("store", rank, size)
    for scenario in scenarios.split(","):
        control = StoreControl(store, rank, size, f"test/{scenario}")
        {
            "exchanges": lambda: exchanges(check, control, store),
            "agreement": lambda: agreement(check, control),
            "split": lambda: split(check, control),
            "timeout": lambda: timeout(check, control),
        }[scenario]()
    check.finish()


if __name__ == "__main__":
    main()
