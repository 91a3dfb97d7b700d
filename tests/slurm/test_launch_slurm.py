"""launch/slurm as a user runs it: a one-node cluster on this machine for one command, then
nothing left of it (daemons, folder)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.slurm.cluster import ROOT
from tests.slurm.conftest import slurm_unavailable
from tests.support.checker import expect_summaries

pytestmark = [pytest.mark.slurm, pytest.mark.mpi]

JOB = Path(__file__).parent / "ranks" / "job.py"


@pytest.mark.timeout(180)
def test_one_node_srun_with_pmi2_and_without(tmp_path: Path) -> None:
    reason = slurm_unavailable()
    if reason is not None:
        pytest.skip(reason)
    before = set(Path("/var/tmp").glob("denseccl-slurm-*"))
    steps = (f"srun -n 2 --mpi=pmi2 {sys.executable} {JOB} mpi && "
             f"srun -n 2 {sys.executable} {JOB} gloo")
    env = {"DENSECCL_VENV": str(Path(sys.executable).parents[1]), "PATH": "/usr/bin:/bin:/usr/sbin:/sbin"}
    done = subprocess.run([str(ROOT / "launch" / "slurm"), "--", "bash", "-c", steps], capture_output=True,
                          text=True, timeout=160, env={**os.environ, **env})
    assert done.returncode == 0, done.stdout + done.stderr
    expect_summaries(done.stdout, "slurm-mpi", 2)
    expect_summaries(done.stdout, "slurm-gloo", 2)
    assert set(Path("/var/tmp").glob("denseccl-slurm-*")) == before
    daemons = subprocess.run(["pgrep", "-a", "-f", "denseccl-slurm-"], capture_output=True, text=True).stdout
    assert "slurm" not in daemons.replace("pgrep", ""), daemons
