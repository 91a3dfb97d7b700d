"""The board's shared page belongs to the MPI library (an MPI.Win.Allocate_shared window): no
file of ours exists in /dev/shm while a job runs, after it ends, or after it is killed. Each
job runs in a private mount namespace with its own tmpfs on /dev/shm, so what it leaves is
seen exactly and discarded with the namespace (the MPI library's own segments, MPICH's mpich_shm_* and Open
MPI's sm_segment.*, outlive a SIGKILL; they are the library's, not ours)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.checker import expect_summaries
from tests.support.ranks import ROOT, mpiexec
from tests.support.segments import is_mpi_segment, kill_session

pytestmark = pytest.mark.mpi

DRIVER = Path(__file__).parent / "ranks" / "kill_job.py"


def _private_shm_works() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", "mount -t tmpfs tmpfs /dev/shm"],
        capture_output=True, timeout=30,
    )
    return probe.returncode == 0


needs_private_shm = pytest.mark.skipif(not _private_shm_works(), reason="needs root and unshare for a private /dev/shm")


def run_job(nranks: int, how: str) -> dict:
    script = f'mount -t tmpfs tmpfs /dev/shm && exec "{sys.executable}" "{DRIVER}" "{mpiexec()}" {nranks} {how}'
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DENSECCL_TIMEOUT": "30"}
    process = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        kill_session(process.pid)
        stdout, stderr = process.communicate()
    found = {}
    for line in stdout.splitlines():
        key, _, value = line.partition(": ")
        if key in ("RUNNING", "LEFT", "READY"):
            found[key] = json.loads(value)
    assert set(found) == {"RUNNING", "LEFT", "READY"}, f"{stdout}\n{stderr}"
    assert found["READY"] == nranks, f"{stdout}\n{stderr}"
    found["output"] = stdout
    return found


def not_mpis(names: list) -> list:
    return [name for name in names if not is_mpi_segment(name)]


@needs_private_shm
@pytest.mark.parametrize("nranks", [2, 3])
def test_a_killed_job_leaves_nothing_of_ours(nranks: int) -> None:
    found = run_job(nranks, "kill")
    assert not_mpis(found["RUNNING"]) == [], found
    assert not_mpis(found["LEFT"]) == [], found


@needs_private_shm
def test_a_finished_job_leaves_nothing() -> None:
    found = run_job(2, "finish")
    expect_summaries(found["output"], "busy", 2)
    assert not_mpis(found["RUNNING"]) == [], found
    assert found["LEFT"] == [], found  # the MPI library removes its own segments at MPI_Finalize
