"""The MPI shared memory a job leaves in /dev/shm is removed by the runner that started it, and
nothing else is: not another job's segment, not one a live process maps. And a run whose jobs
leave some fails (the session check in tests/conftest.py)."""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import re
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.checker import expect_summaries
from tests.support.ranks import ROOT, flavour, mpiexec, run_ranks
from tests.support.segments import JOBS, SEGMENT, SHM, Job, first_rand, fnv1a

pytestmark = pytest.mark.mpi

KILLED = Path(__file__).parent / "ranks" / "killed_rank.py"

#: the jobs of these tests must leave MPICH's segments; Open MPI names its shared memory otherwise
#: and removes it from its launcher
mpich_only = pytest.mark.skipif(
    flavour(mpiexec()) != "mpich", reason="MPICH's shared-memory segments: the launcher here is not hydra"
)


def other_jobs_name() -> Path:
    """A path named like a segment of some other job (a world id no job of ours has)."""
    return SHM / f"mpich_shm_{secrets.token_hex(4)}_0"


def maps_of(stdout: str) -> set:
    """What the ranks said they map (their lines may run together in mpiexec's output)."""
    return set().union(*(json.loads(found) for found in re.findall(r"MAPS (\[[^\]]*\])", stdout)))


@mpich_only
@pytest.mark.timeout(150)
def test_a_killed_rank_leaves_nothing_of_its_job() -> None:
    """The runner removes exactly the segments the job's ranks mapped, though a segment of
    another job appeared meanwhile."""
    unrelated = other_jobs_name()
    try:
        done = run_ranks(2, KILLED, [unrelated], timeout=120, expect_failure=True)
        expect_summaries(done.stdout, "killed_rank", 2)
        assert "NOT ENDED" not in done.stdout
        ours = maps_of(done.stdout)
        assert ours and all(SEGMENT.match(name) for name in ours), done.stdout
        assert not [name for name in ours if (SHM / name).exists()], f"the job's segments {ours} are left"
        assert JOBS[-1].removed == ours, f"removed {JOBS[-1].removed}, the ranks mapped {ours}"
        # made while the job ran, unmapped, named as MPICH names segments: still not the job's
        # (not asserted by its presence: any runner on this machine may remove such an orphan)
        assert unrelated.name not in JOBS[-1].segments() | JOBS[-1].removed
    finally:
        unrelated.unlink(missing_ok=True)


def test_the_world_ids_follow_glibc_and_fnv() -> None:
    """The generator is glibc's (the one hydra's mpiexec calls), the hash FNV-1a."""
    libc = ctypes.CDLL(None)
    for seed in (0, 1, 12345, 2**31 + 7, int(time.time())):
        libc.srand(seed)
        assert libc.rand() == first_rand(seed), seed
    assert fnv1a("") == 0x811C9DC5 and fnv1a("a") == 0xE40C292C  # the published test vectors


def test_a_segment_a_live_process_maps_stays() -> None:
    """A job's segment that some process still maps is kept, and removed once unmapped."""
    job = Job(["true"])
    job.process.wait()
    path = SHM / f"mpich_shm_{job.process.pid:x}_0"  # the name a singleton with this pid gives
    path.write_bytes(bytes(4096))
    try:
        with open(path, "r+b") as f, mmap.mmap(f.fileno(), 4096):
            assert job.finish(settle=0.5) == set() and path.exists()
        assert job.remove(settle=0) == {path.name} and not path.exists()
    finally:
        path.unlink(missing_ok=True)


INNER = """
from pathlib import Path
from tests.support import segments
from tests.support.ranks import run_ranks

def test_a_runner_that_forgets(monkeypatch):
    monkeypatch.setattr(segments.Job, "remove", lambda self, settle=0: set())
    run_ranks(2, {killed!r}, [{unrelated!r}], timeout=120, expect_failure=True)
"""


@mpich_only
@pytest.mark.timeout(200)
def test_the_run_fails_when_its_jobs_leave_segments(tmp_path: Path) -> None:
    """A run whose runner removed nothing fails at its end, naming the segments, and removes
    them then."""
    unrelated = other_jobs_name()
    (tmp_path / "test_inner.py").write_text(INNER.format(killed=str(KILLED), unrelated=str(unrelated)))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:cacheprovider", str(tmp_path)],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
            timeout=180,
        )
        output = done.stdout + done.stderr
        assert "1 passed" in output and done.returncode == 1, output
        left = [line for line in output.splitlines() if "were left in /dev/shm" in line]
        assert left and "mpich_shm_" in left[0], output
        names = re.findall(r"mpich_(?:shm|vci)_[0-9a-f]+_\d+", left[0])
        assert names and unrelated.name not in left[0], output
        assert not [path for path in SHM.iterdir() if path.name in left[0]], "the session check kept them"
    finally:
        unrelated.unlink(missing_ok=True)
