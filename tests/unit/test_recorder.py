"""The flight recorder's ring on its own (recorder.py, no ranks): bounded, in order, the states
of its calls, the settings that size and place it. Real ranks: tests/mpi/test_recorder.py."""

from __future__ import annotations

import json

import pytest

from denseccl import config
from denseccl.agreement import Descriptor
from denseccl.errors import CollectiveTimeoutError, DenseCCLError, MismatchError
from denseccl.recorder import FORMAT, Recorder
from denseccl.trace_summary import summarize


def call(n: int) -> Descriptor:
    return Descriptor("allreduce", None, "sum", ("float32", (n, 3), (3, 1)))


def test_ring_keeps_the_last_calls_in_order_with_their_states(tmp_path, monkeypatch):
    monkeypatch.setenv("DENSECCL_TRACE_DIR", str(tmp_path))
    ring = Recorder(1, 2, "mpi", 4)
    for n in range(6):
        ring.record(call(n))
    ring.failed(MismatchError("ranks disagree"))  # the latest call; no dump for a mismatch
    ring.record(call(6))
    seq = ring.began_async()
    dump = json.loads(open(ring.dump(str(tmp_path))).read())
    assert dump["format"] == FORMAT and (dump["rank"], dump["size"], dump["recorded"]) == (1, 2, 7)
    assert [c["seq"] for c in dump["calls"]] == [3, 4, 5, 6] and seq == 6
    assert [c["shape"] for c in dump["calls"]] == [[3, 3], [4, 3], [5, 3], [6, 3]]
    assert [c["state"] for c in dump["calls"]] == ["completed", "completed", "failed", "started"]
    assert dump["calls"][2]["error"] == "MismatchError: ranks disagree" and ring.dumped is None
    ring.record(call(7))
    ring.failed(CollectiveTimeoutError("the agreement of call 7"))  # no Work yet: the latest call failed
    ring.failed(CollectiveTimeoutError("the Work of call 6"))  # then the Work in flight
    assert [c["state"] for c in ring.entries()[-2:]] == ["failed", "failed"]
    assert ring.entries()[-1]["error"] == "CollectiveTimeoutError: the agreement of call 7"


def test_a_timeout_dumps_once_into_the_trace_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("DENSECCL_TRACE_DIR", str(tmp_path))
    ring = Recorder(0, 2, "mpi", 8)
    ring.record(call(1))
    ring.failed(CollectiveTimeoutError("a peer never joined"))
    assert ring.dumped == str(tmp_path / f"comm{ring.number}-rank0.json")
    first = json.loads(open(ring.dumped).read())
    assert first["reason"] == "failure: a peer never joined" and first["calls"][0]["state"] == "failed"
    ring.record(call(2))
    ring.failed(CollectiveTimeoutError("again"))
    assert json.loads(open(ring.dumped).read())["recorded"] == 1  # the first failure's dump stays


def test_summary_of_two_ranks_whose_call_counts_differ():
    ahead, behind = Recorder(0, 2, "mpi", 8), Recorder(1, 2, "mpi", 8)
    behind.number = ahead.number
    for n in range(3):
        ahead.record(call(n))
    for n in range(2):
        behind.record(call(n))
    lines = summarize({0: ahead.snapshot("test"), 1: behind.snapshot("test")})
    assert lines[1] == "  calls recorded: rank 0: 3, rank 1: 2"
    assert lines[2] == (
        "  behind: rank 1 never made call #2 (allreduce op=sum float32 shape (2, 3) strides (3, 1)), which rank 0 made "
        "(its last call: #1)"
    )


def test_settings():
    assert config.settings({}).trace_buffer == 0 and config.settings({}).trace_dir is None
    assert config.settings({"DENSECCL_TRACE_BUFFER": "256"}).trace_buffer == 256
    with pytest.raises(DenseCCLError, match="DENSECCL_TRACE_BUFFER must be a whole number"):
        config.settings({"DENSECCL_TRACE_BUFFER": "-3"})
