"""The flight recorder read back through its summary command: a rank that skipped a call, a
stopped rank, a layout mismatch (3 real ranks each; rank program: ranks/recorder.py); two jobs on
one host that keep both dumps, and a job whose dump folder another user made first (2 ranks
each; ranks/trace_jobs.py)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.checker import expect_summaries
from tests.support.ranks import ROOT, run_ranks

pytestmark = pytest.mark.mpi

RANKS = Path(__file__).parent / "ranks"
CALL = "allreduce op=sum float32 shape (4, 6) strides (6, 1)"


def summary(folder: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "denseccl.trace_summary", str(folder)], capture_output=True, text=True, timeout=60,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def job(scenario: str, folder: Path, expect_failure=None):
    env = {"DENSECCL_TRACE_DIR": str(folder), "DENSECCL_TRACE_BUFFER": "64"}
    return run_ranks(3, RANKS / "recorder.py", [scenario, "3"], timeout=150, env=env, expect_failure=expect_failure)


@pytest.mark.timeout(200)
def test_summary_names_the_rank_that_skipped_a_call(tmp_path):
    done = job("skip", tmp_path)
    expect_summaries(done.stdout, "recorder-skip", 3)
    text = summary(tmp_path)
    assert "calls recorded: rank 0: 5, rank 1: 5, rank 2: 4" in text, text
    assert f"behind: rank 2 never made call #4 ({CALL}), which ranks 0, 1 made (its last call: #3)" in text, text
    for rank in (0, 1):  # the call rank 2 never made failed on the others: a timeout, or the peer's give-up
        assert f"rank {rank}: call #4 ({CALL}) failed: " in text, text
    assert "rank 2: call #" not in text, text  # all of rank 2's own calls completed
    assert "descriptors: every call the ranks' dumps share (#0-#3) is the same on every rank" in text, text


@pytest.mark.timeout(200)
def test_summary_names_a_stopped_rank(tmp_path):
    done = job("stop", tmp_path)
    found = sorted(done.stdout.count(f"[recorder-stop] rank {rank}/3: OK") for rank in range(3))
    assert found == [0, 1, 1] and "[recorder-stop] rank 1/3" not in done.stdout, done.stdout
    text = summary(tmp_path)
    assert "communicator 0: 3 ranks, dumps from ranks 0, 2" in text, text
    assert (
        f"behind: rank 1 wrote no dump (stopped, killed, or stuck outside denseccl): ranks 0, 2 failed in call #3 "
        f"({CALL}) without it" in text
    ), text
    for rank in (0, 2):
        assert f"rank {rank}: call #3 ({CALL}) failed: " in text, text
    (found,) = tmp_path.glob("*/comm0-rank0.json")  # in the job's folder
    dump = json.loads(found.read_text())
    assert dump["reason"].startswith("failure: ") and [c["state"] for c in dump["calls"]] == ["completed"] * 3 + [
        "failed"
    ], dump


@pytest.mark.timeout(200)
def test_summary_shows_where_descriptors_differ(tmp_path):
    done = job("mismatch", tmp_path, expect_failure=False)
    expect_summaries(done.stdout, "recorder-mismatch", 3)
    text = summary(tmp_path)
    assert "no rank is behind: every rank made 5 calls" in text, text
    assert (
        "descriptors differ at call #2 (layout):\n"
        f"    ranks 0, 2: {CALL}\n"
        "    rank 1: allreduce op=sum float32 shape (4, 6) strides (1, 4)\n"
    ) in text, text
    assert "descriptors differ at call #" not in text.replace("descriptors differ at call #2", ""), text
    for rank in range(3):
        mine = CALL if rank != 1 else "allreduce op=sum float32 shape (4, 6) strides (1, 4)"
        seen = f"failed: MismatchError: collective mismatch seen by rank {rank}: ranks disagree on layout."
        assert f"rank {rank}: call #2 ({mine}) {seen}" in text, text


def trace_job(mode: str, tmpdir: Path) -> subprocess.CompletedProcess:
    """A 2-rank job (ranks/trace_jobs.py) that dumps into the per-user default folder under
    ``tmpdir``; its stdout."""
    env = {"TMPDIR": str(tmpdir), "DENSECCL_TRACE_DIR": "", "DENSECCL_TRACE_BUFFER": ""}  # the defaults
    done = run_ranks(2, RANKS / "trace_jobs.py", [mode], timeout=100, env=env)
    expect_summaries(done.stdout, f"trace-jobs-{mode}", 2)
    return done


@pytest.mark.timeout(250)
def test_two_jobs_on_one_host_keep_both_dumps(tmp_path):
    first, second = (trace_job("dump", tmp_path).stdout for _ in range(2))
    default = tmp_path / f"denseccl-trace-{os.geteuid()}"
    jobs = []
    for out in (first, second):
        (job,) = set(line.split()[1] for line in out.splitlines() if line.startswith("job "))
        dumped = sorted(line.split()[1] for line in out.splitlines() if line.startswith("dumped "))
        assert dumped == [str(default / job / f"comm0-rank{r}.json") for r in range(2)], out
        jobs.append(job)
    assert jobs[0] != jobs[1] and sorted(os.listdir(default)) == sorted(jobs)
    assert stat.S_IMODE(os.stat(default).st_mode) == 0o700
    for job in jobs:  # both jobs' dumps are whole and read back
        assert sorted(os.listdir(default / job)) == ["comm0-rank0.json", "comm0-rank1.json"]
        text = summary(default / job)
        assert "communicator 0: 2 ranks, dumps from ranks 0, 1" in text, text
        assert "no rank is behind: every rank made 3 calls" in text, text
        assert "descriptors: every call the ranks' dumps share (#0-#2) is the same on every rank" in text, text
    text = summary(default)  # the folder above the jobs: the newest job
    assert text.startswith(f"job folder {default / jobs[1]} (the newest of 2 jobs;"), text


@pytest.mark.timeout(150)
def test_a_job_whose_dump_folder_another_user_made_warns_and_runs_on(tmp_path):
    default = tmp_path / f"denseccl-trace-{os.geteuid()}"
    default.mkdir(mode=0o777)
    os.chown(default, 4242, 4242)
    done = trace_job("refused", tmp_path)
    assert os.listdir(default) == []
    refusals = [line for line in done.stderr.splitlines() if "flight recorder dump not written" in line]
    assert len(refusals) == 2 and all("belongs to uid 4242" in line for line in refusals), done.stderr


@pytest.mark.timeout(120)
def test_recorder_hook_times_on_off_and_off_again_on_two_ranks():
    done = run_ranks(2, "-m", ["denseccl.bench.recorder_hook", "--calls", "20", "--blocks", "6"], timeout=100)
    lines = done.stdout.splitlines()
    assert lines[0] == "# 4096 B float32 allreduce, 2 rank(s), 6 blocks x 20 calls, alternating", done.stdout
    rows = {line.split()[0]: line for line in lines[2:]}
    assert sorted(rows) == ["clock", "off", "off2", "on", "on2", "pooled"], done.stdout
    assert "min: 1.0000 (+0 ns)" in rows["off"], done.stdout  # off is the reference of the ratios
    assert "(on+on2 against off+off2)" in rows["pooled"], done.stdout
