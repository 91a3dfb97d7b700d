"""The agreement check, with ranks simulated by threads over an in-memory control channel,
and the digest's stability across processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from typing import List, Optional, Sequence

import pytest

import denseccl
from denseccl.agreement import Descriptor, agree, digest, mismatch_report
from denseccl.layout import layout_key
from denseccl.channel.base import ControlChannel
from tests.support.ranks import ROOT


class _Group:
    def __init__(self, size: int) -> None:
        self.size = size
        self.barrier = threading.Barrier(size)
        self.slots: List[object] = [None] * size
        self.calls = 0


class ThreadChannel(ControlChannel):
    """A control channel among threads of one process: each thread plays one rank."""

    def __init__(self, group: _Group, rank: int) -> None:
        self.group, self.rank, self.size = group, rank, group.size

    def _exchange(self, mine: object) -> List[object]:
        self.group.slots[self.rank] = mine
        self.group.barrier.wait(timeout=10)
        everything = list(self.group.slots)
        self.group.barrier.wait(timeout=10)
        return everything

    def allreduce_max(self, values: Sequence[int], deadline: Optional[float]) -> Sequence[int]:
        if self.rank == 0:
            self.group.calls += 1
        for v in values:
            assert -(2**63) <= v < 2**63, "must fit a signed 64-bit integer"
        return [max(column) for column in zip(*self._exchange(list(values)))]

    def allgather_bytes(self, data: bytes, deadline: Optional[float]) -> Sequence[bytes]:
        if self.rank == 0:
            self.group.calls += 1
        return self._exchange(bytes(data))


def run_agree(descriptors: Sequence[Descriptor], invalid: Sequence[Optional[BaseException]] = ()):
    """Run agree() on every simulated rank; return (outcome per rank, control calls made)."""
    size = len(descriptors)
    invalid = list(invalid) + [None] * (size - len(invalid))
    group = _Group(size)
    outcomes: List[object] = [None] * size

    def rank_main(rank: int) -> None:
        try:
            agree(ThreadChannel(group, rank), descriptors[rank], None, invalid[rank])
            outcomes[rank] = "ok"
        except BaseException as error:  # noqa: BLE001
            outcomes[rank] = error

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads), "agree() hung"
    return outcomes, group.calls


def key(shape, strides, dtype="float32"):
    return layout_key(dtype, tuple(shape), tuple(strides))


C = key((3, 4), (4, 1))
F = key((3, 4), (1, 3))


def test_agreement_passes_with_one_cheap_exchange():
    outcomes, calls = run_agree([Descriptor("allreduce", None, "sum", C)] * 3)
    assert outcomes == ["ok"] * 3
    assert calls == 1  # the digest allreduce only; no descriptor exchange


def test_size1_strides_do_not_matter():
    a = Descriptor("allreduce", None, "sum", key((4, 1, 1), (1, 4, 4)))
    b = Descriptor("allreduce", None, "sum", key((4, 1, 1), (1, 99, -3)))
    outcomes, _ = run_agree([a, b])
    assert outcomes == ["ok", "ok"]


def test_layout_mismatch_is_raised_everywhere_with_every_descriptor():
    good = Descriptor("allreduce", None, "sum", C)
    bad = Descriptor("allreduce", None, "sum", F)
    outcomes, _ = run_agree([good, bad, good])
    assert all(isinstance(o, denseccl.MismatchError) for o in outcomes)
    for rank, error in enumerate(outcomes):
        text = str(error)
        assert "mismatch" in text and f"seen by rank {rank}" in text
        assert "ranks disagree on layout." in text
        assert "ranks 0, 2: allreduce op=sum float32 shape (3, 4) strides (4, 1)" in text
        assert "rank 1: allreduce op=sum float32 shape (3, 4) strides (1, 3)" in text
        assert "still usable" in text
    # the same report on every rank, but for the headline naming who saw it
    assert len({str(e).split("\n", 1)[1] for e in outcomes}) == 1


@pytest.mark.parametrize(
    "other, field",
    [
        (Descriptor("allreduce", None, "sum", key((4, 3), (3, 1))), "shape"),
        (Descriptor("allreduce", None, "sum", key((3, 4), (4, 1), "float64")), "dtype"),
        (Descriptor("allreduce", None, "max", C), "op"),
        (Descriptor("broadcast", 0, None, C), "collective"),
        (Descriptor("barrier"), "collective"),
    ],
)
def test_each_field_is_named(other, field):
    mine = Descriptor("allreduce", None, "sum", C)
    outcomes, _ = run_agree([mine, mine, other, other])
    for error in outcomes:
        assert isinstance(error, denseccl.MismatchError)
        headline = str(error).split("\n")[0]
        assert field in headline, headline
        assert "ranks 0, 1: allreduce" in str(error) and f"ranks 2, 3: {other.describe()}" in str(error)


def test_root_mismatch():
    outcomes, _ = run_agree([Descriptor("reduce", r % 2, "sum", C) for r in range(3)])
    for error in outcomes:
        text = str(error)
        assert "ranks disagree on root" in text
        assert "ranks 0, 2: reduce root=0" in text and "rank 1: reduce root=1" in text


def test_three_way_mismatch_lists_three_groups():
    ds = [Descriptor("allreduce", None, "sum", key((2,), (1,), dtype)) for dtype in ("float32", "float64", "int8")]
    outcomes, _ = run_agree(ds)
    text = str(outcomes[0])
    for rank, dtype in enumerate(("float32", "float64", "int8")):
        assert f"rank {rank}: allreduce op=sum {dtype} shape (2,) strides (1,)" in text


def test_invalid_input_raises_its_own_error_there_and_mismatch_elsewhere():
    good = Descriptor("allreduce", None, "sum", C)
    problem = denseccl.LayoutError("input float32 shape (3, 4) strides (8, 2) is not dense")
    outcomes, _ = run_agree([good, Descriptor("allreduce"), good], [None, problem, None])
    assert outcomes[1] is problem
    for rank in (0, 2):
        text = str(outcomes[rank])
        assert isinstance(outcomes[rank], denseccl.MismatchError)
        assert "mismatch" in text and "a peer's input failed validation" in text
        assert (
            "rank 1: allreduce with an invalid input "
            "(LayoutError: input float32 shape (3, 4) strides (8, 2) is not dense)"
            in text
        )
        assert "ranks 0, 2: allreduce op=sum float32 shape (3, 4) strides (4, 1)" in text


def test_invalid_on_every_rank():
    errors = [denseccl.LayoutError(f"bad {r}") for r in range(2)]
    outcomes, _ = run_agree([Descriptor("broadcast")] * 2, errors)
    assert outcomes == errors


def test_wildcards_are_shown_as_stars():
    d = Descriptor("allgather", None, None, key((0, 3), (3, 1)))
    assert d.describe() == "allgather float32 shape (0, 3) strides (*, *)"
    assert Descriptor("reduce", 2, "premul_sum(0.5)", key((2, 1), (1, 7))).describe() == (
        "reduce root=2 op=premul_sum(0.5) float32 shape (2, 1) strides (1, *)"
    )


def test_mismatch_report_from_raw_entries():
    """The report is built from JSON payloads (lists, not tuples): it must read them back."""
    entries = [
        json.loads(json.dumps({"descriptor": list(Descriptor("allreduce", None, "sum", C)), "invalid": None})),
        json.loads(json.dumps({"descriptor": list(Descriptor("allreduce", None, "sum", F)), "invalid": None})),
    ]
    text = mismatch_report(entries, 1)
    assert text.startswith("collective mismatch seen by rank 1: ranks disagree on layout.")
    assert "rank 0: allreduce op=sum float32 shape (3, 4) strides (4, 1)" in text
    assert "rank 1: allreduce op=sum float32 shape (3, 4) strides (1, 3)" in text


# -- the digest ------------------------------------------------------------------------------

SAMPLE = [
    Descriptor("allreduce", None, "sum", C),
    Descriptor("allreduce", None, "sum", F),
    Descriptor("allreduce", None, "max", C),
    Descriptor("reduce", 0, "sum", C),
    Descriptor("reduce", 1, "sum", C),
    Descriptor("broadcast", 0, None, key((0, 3), (3, 1))),
    Descriptor("allgather", None, None, key((), (), "bfloat16")),
    Descriptor("reduce_scatter", None, "premul_sum(0.5)", key((2, 1), (1, 5))),
    Descriptor("barrier"),
]


def test_digest_is_63_bits_and_distinct():
    values = [digest(d) for d in SAMPLE]
    assert all(0 <= v < 2**63 for v in values)
    assert len(set(values)) == len(SAMPLE)
    assert digest(Descriptor("allreduce", None, "sum", key((4, 1), (1, 4)))) == digest(
        Descriptor("allreduce", None, "sum", key((4, 1), (1, 9)))
    )


def test_digest_is_stable_across_processes():
    code = (
        "import json, sys\n"
        "from denseccl.agreement import Descriptor, digest\n"
        "raw = json.loads(sys.stdin.read())\n"
        "def tup(x): return tuple(tup(i) for i in x) if isinstance(x, list) else x\n"
        "print(json.dumps([digest(Descriptor(*tup(d))) for d in raw]))\n"
    )
    payload = json.dumps([list(d) for d in SAMPLE])
    expected = [digest(d) for d in SAMPLE]
    for seed in ("0", "12345"):
        env = dict(os.environ, PYTHONHASHSEED=seed, PYTHONPATH=str(ROOT))
        done = subprocess.run(
            [sys.executable, "-c", code], input=payload, capture_output=True, text=True, env=env, timeout=60, check=True
        )
        assert json.loads(done.stdout) == expected
