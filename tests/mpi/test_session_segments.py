"""A run whose processes leave an MPI singleton's segment in /dev/shm fails, naming the command
that made it, and removes it (tests/conftest.py with tests/support/segments.Descendants): a
program a test starts without a launcher that imports mpi4py.MPI and leaves by ``os._exit`` (no
``MPI_Finalize``); and the test process itself, a singleton once a test imports mpi4py.MPI,
finalizes at the end of the session, so its own segment is gone before the interpreter exits."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.ranks import ROOT, flavour, mpiexec
from tests.support.segments import SHM

pytestmark = pytest.mark.mpi
mpich_only = pytest.mark.skipif(flavour(mpiexec()) != "mpich", reason="MPICH names a singleton's segment by its pid")

INNER = """
import subprocess, sys

def test_a_program_that_skips_finalize():
    code = "from mpi4py import MPI; import os; print(MPI.COMM_WORLD.Get_size(), os.getpid(), flush=True); os._exit(0)"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)

def test_this_process_is_a_singleton():
    from mpi4py import MPI
    import os
    print("INNER", os.getpid(), MPI.COMM_WORLD.Get_size())
"""


def inner_run(tmp_path: Path) -> subprocess.CompletedProcess:
    (tmp_path / "test_inner.py").write_text(INNER)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-s", "-p", "tests.conftest", "-p", "no:cacheprovider", str(tmp_path)],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=180,
    )


@mpich_only
@pytest.mark.timeout(200)
def test_a_singletons_segment_fails_the_run_and_is_removed(tmp_path: Path) -> None:
    done = inner_run(tmp_path)
    output = done.stdout + done.stderr
    assert "2 passed" in output and done.returncode == 1, output
    line = next((line for line in output.splitlines() if "singleton segment" in line), "")
    names = re.findall(r"mpich_shm_[0-9a-f]+_\d+", line)
    assert len(names) == 1 and "os._exit(0)" in line, output  # the program's, with its command
    assert not (SHM / names[0]).exists(), "the session check kept it"
    inner = re.search(r"INNER (\d+) 1", output)
    assert inner, output
    assert not list(SHM.glob(f"mpich_*_{int(inner.group(1)):x}_*")), "the test process left its own segment"
