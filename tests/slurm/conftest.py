"""A 2-node Slurm cluster on simulated hosts for the tests in this folder, one per session,
stopped at its end; or skipped with the reason (packages missing and not installable, no root,
no namespaces)."""

from __future__ import annotations

import subprocess
from typing import Iterator

import pytest

from tests.hosts.simhosts import unavailable as namespaces_unavailable
from tests.slurm.cluster import ROOT, SlurmCluster, unavailable


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slurm: runs srun and sbatch jobs on a Slurm cluster of its own (needs root)")


def slurm_unavailable() -> str | None:
    """Why no cluster can start here, after ``launch/slurm --install`` tried to install Slurm."""
    install = subprocess.run([str(ROOT / "launch" / "slurm"), "--install"], capture_output=True, text=True,
                             timeout=300)
    if install.returncode != 0:
        return install.stderr.strip().replace("[slurm] ", "") or f"launch/slurm --install exited {install.returncode}"
    return unavailable()


@pytest.fixture(scope="session")
def cluster() -> Iterator[SlurmCluster]:
    reason = slurm_unavailable() or namespaces_unavailable()
    if reason is not None:
        pytest.skip(reason)
    with SlurmCluster(2) as running:
        yield running
