"""The flight recorder's ring on its own (recorder.py, no ranks): bounded, in order, the states
of its calls, the settings that size and place it, and dump folders that are not safe on a shared
host (made first by another user, or holding a symlink). Real ranks: tests/mpi/test_recorder.py."""

from __future__ import annotations

import json
import logging
import os
import stat
from array import array
import sys
import tempfile
import time

import pytest

from denseccl import config
from denseccl.agreement import Descriptor
from denseccl.errors import CollectiveTimeoutError, DenseCCLError, MismatchError
from denseccl.recorder import FORMAT, PythonRing, Recorder, ring_type
from denseccl.trace_summary import summarize

#: a uid that is not this process's: the owner of folders "another user" made first
OTHER_UID = 4242


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
    assert ring.dumped == str(tmp_path / ring.job / f"comm{ring.number}-rank0.json")
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
    assert config.settings({}).trace_dir is None
    assert config.settings({"DENSECCL_TRACE_BUFFER": "0"}).trace_buffer == 0
    assert config.settings({"DENSECCL_TRACE_BUFFER": "256"}).trace_buffer == 256
    with pytest.raises(DenseCCLError, match="DENSECCL_TRACE_BUFFER must be a whole number"):
        config.settings({"DENSECCL_TRACE_BUFFER": "-3"})


def test_the_recorder_is_on_by_default():
    assert config.settings({}).trace_buffer == config.DEFAULT_TRACE_BUFFER == 1024


def test_the_ring_is_made_once_and_holds_what_it_recorded():
    ring = Recorder(0, 2, "mpi", 3)
    calls, times = ring.calls, ring.times
    descriptors = [call(n) for n in range(7)]
    read = []
    for descriptor in descriptors:
        before = time.monotonic()
        read.append(ring.record(descriptor))
        assert before <= read[-1] <= time.monotonic()  # time.monotonic()'s clock, read in the record
    assert ring.calls is calls and ring.times is times and len(calls) == len(times) == 4  # never regrown
    assert ring.count == 7 and [e["seq"] for e in ring.entries()] == [4, 5, 6]
    assert [calls[seq % 4] for seq in (4, 5, 6)] == descriptors[4:]  # by reference, not copied
    assert all(calls[seq % 4] is descriptors[seq] for seq in (4, 5, 6))
    assert [times[seq % 4] for seq in (4, 5, 6)] == read[4:]
    offset = time.time() - time.monotonic()
    assert [e["started"] for e in ring.entries()] == pytest.approx([t + offset for t in read[4:]], abs=0.01)


def test_the_compiled_ring_is_built_here():
    """setup.py builds denseccl._ring wherever a C compiler is (this machine and CI): the record
    then costs about what the clock read alone does."""
    assert ring_type() is not PythonRing
    assert isinstance(Recorder(0, 2, "mpi", 3).ring, ring_type())


@pytest.mark.parametrize("kind", ["compiled", "python"])
def test_both_rings_record_alike(kind):
    make = ring_type() if kind == "compiled" else PythonRing
    calls, times = [None] * 3, array("d", [0.0] * 3)
    ring = make(calls, times)
    marks = [object() for _ in range(5)]
    alive = sys.getrefcount(marks[0])
    now = [ring.record(mark) for mark in marks]
    held = sys.getrefcount(marks[0])
    assert held == alive  # the overwritten entry was let go of
    assert ring.count == 5 and ring.length == 3 and now == sorted(now)
    assert calls == [marks[3], marks[4], marks[2]] and times.tolist() == [now[3], now[4], now[2]]
    with pytest.raises(ValueError, match="same length"):
        make([None] * 2, array("d", [0.0] * 3))
    with pytest.raises(ValueError, match="at least 1"):
        make([], array("d"))


def test_the_compiled_ring_refuses_storage_resized_under_it():
    calls, times = [None] * 2, array("d", [0.0] * 2)
    ring = ring_type()(calls, times)
    ring.record("a")
    with pytest.raises(BufferError):
        times.append(1.0)  # the ring holds the array's buffer: it cannot move
    del calls[:]
    with pytest.raises(RuntimeError, match="resized"):
        ring.record("b")
    assert ring.count == 1 and times[0] > 0 and calls == []
    with pytest.raises(TypeError, match="doubles"):
        ring_type()([None] * 2, array("f", [0.0] * 2))


@pytest.fixture
def own_tmpdir(tmp_path, monkeypatch):
    """The temporary directory (where the per-user default folder goes) moved into ``tmp_path``."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir() caches its answer
    monkeypatch.delenv("DENSECCL_TRACE_DIR", raising=False)
    return tmp_path


def failing_ring(rank: int = 0) -> Recorder:
    ring = Recorder(rank, 2, "mpi", 8)
    ring.record(call(1))
    return ring


def test_the_default_folder_is_the_users_own_with_a_folder_per_job(own_tmpdir):
    ring = failing_ring()
    ring.failed(CollectiveTimeoutError("a peer never joined"))
    default = own_tmpdir / f"denseccl-trace-{os.geteuid()}"
    assert config.trace_dir() == str(default)
    assert ring.dumped == str(default / ring.job / f"comm{ring.number}-rank0.json")
    for folder in (default, default / ring.job):
        info = os.lstat(folder)
        assert stat.S_ISDIR(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o700 and info.st_uid == os.geteuid()
    assert stat.S_IMODE(os.stat(ring.dumped).st_mode) == 0o600
    assert sorted(os.listdir(default / ring.job)) == [f"comm{ring.number}-rank0.json"]  # no temporary left


def refused(caplog, ring: Recorder) -> str:
    """Break ``ring``'s communicator: it must warn that the dump was not written, and raise
    when asked to dump."""
    with caplog.at_level(logging.WARNING, logger="denseccl"):
        ring.failed(CollectiveTimeoutError("a peer never joined"))  # must not raise
    assert ring.dumped == "", ring.dumped
    warnings = [r.getMessage() for r in caplog.records if "dump not written" in r.getMessage()]
    assert len(warnings) == 1, caplog.records
    with pytest.raises(DenseCCLError) as raised:
        ring.dump()
    assert str(raised.value) in warnings[0]
    return warnings[0]


def test_a_default_folder_made_first_by_another_user_is_refused(own_tmpdir, caplog):
    default = config.trace_dir()
    os.mkdir(default, 0o777)
    os.chmod(default, 0o777)  # as an attacker would leave it
    os.chown(default, OTHER_UID, OTHER_UID)
    warning = refused(caplog, failing_ring())
    assert f"belongs to uid {OTHER_UID}" in warning and "DENSECCL_TRACE_DIR" in warning, warning
    assert os.listdir(default) == []


def test_a_default_folder_that_is_a_symlink_is_refused(own_tmpdir, caplog):
    elsewhere = own_tmpdir / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    os.symlink(elsewhere, config.trace_dir())
    warning = refused(caplog, failing_ring())
    assert "is a symlink or not a folder" in warning, warning
    assert os.listdir(elsewhere) == []


def test_a_job_folder_made_first_by_another_user_is_refused(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("DENSECCL_TRACE_DIR", str(tmp_path / "traces"))
    ring = failing_ring()
    taken = tmp_path / "traces" / ring.job
    taken.mkdir(parents=True)
    os.chown(taken, OTHER_UID, OTHER_UID)
    warning = refused(caplog, ring)
    assert f"the job's dump folder {taken} belongs to uid {OTHER_UID}" in warning, warning
    assert os.listdir(taken) == []


def test_a_symlink_where_the_dump_goes_is_refused_and_not_written_through(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("DENSECCL_TRACE_DIR", str(tmp_path / "traces"))
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    ring = failing_ring()
    first = ring.dump()  # the folder is made and safe: plant a symlink at the dump's own name
    os.unlink(first)
    os.symlink(victim, first)
    warning = refused(caplog, ring)
    assert "is a symlink" in warning, warning
    assert victim.read_text() == "keep me" and os.path.islink(first)
    assert sorted(os.listdir(os.path.dirname(first))) == [os.path.basename(first)]  # no temporary left
