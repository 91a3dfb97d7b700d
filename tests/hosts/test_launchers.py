"""Which mpiexec the rank tests start: DENSECCL_TEST_MPIEXEC (a cluster's module-loaded one)
wins over the one in the environment's bin; Open MPI gets the options it needs."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from tests.support import ranks

pytestmark = pytest.mark.mpi

PROGRAM = "from mpi4py import MPI; c = MPI.COMM_WORLD; n = c.allreduce(1); print('ranks', n) if c.rank == 0 else None"


def wrapper(directory: Path, version: str) -> Path:
    """An mpiexec that leaves a mark, says ``version`` to --version, and runs the real one."""
    path = directory / "mpiexec"
    real = ranks.mpiexec()
    path.write_text(f'#!/bin/sh\n[ "$1" = --version ] && {{ echo "{version}"; exit 0; }}\n'
                    f'echo used >> "{directory}/marks"\nexec "{real}" "$@"\n')
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_the_chosen_mpiexec_starts_the_ranks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = ranks.mpiexec()
    version = subprocess.run([real, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    chosen = wrapper(tmp_path, version)
    monkeypatch.setenv("DENSECCL_TEST_MPIEXEC", str(chosen))
    assert ranks.mpiexec() == str(chosen)
    script = tmp_path / "size.py"
    script.write_text(PROGRAM)
    done = ranks.run_ranks(2, script, timeout=60)
    assert "ranks 2" in done.stdout, done.stdout
    assert (tmp_path / "marks").read_text().split() == ["used"]


def test_open_mpi_gets_oversubscribe_and_root_permission(tmp_path: Path) -> None:
    fake = wrapper(tmp_path, "mpiexec (Open MPI) 5.0.11")
    prefix, env = ranks.launch(str(fake), 4)
    assert prefix == [str(fake), "--oversubscribe", "-n", "4"]
    assert env == ({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"} if os.geteuid() == 0 else {})


def test_a_missing_choice_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DENSECCL_TEST_MPIEXEC", "/nonexistent/mpiexec")
    with pytest.raises(RuntimeError, match="DENSECCL_TEST_MPIEXEC"):
        ranks.mpiexec()
