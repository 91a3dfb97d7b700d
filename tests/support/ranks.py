"""Start real ranks with mpiexec in a subprocess, with a hard time limit.

Rank programs are ordinary Python files that exit non-zero (an uncaught exception, e.g. a
failed assert) when a check fails; ``run_ranks`` turns that into a test failure that shows
every rank's output.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Dict, Optional, Sequence

ROOT = Path(__file__).resolve().parents[2]


def mpiexec() -> str:
    """The mpiexec beside the running interpreter (the venv's), else the one on PATH."""
    beside = Path(sys.executable).with_name("mpiexec")
    if beside.exists():
        return str(beside)
    found = shutil.which("mpiexec")
    if found is None:
        raise RuntimeError("no mpiexec: install the mpi extra (pip install 'denseccl[mpi]') or run launch/setup")
    return found


def kill_session(session: int) -> None:
    """SIGKILL every process of ``session`` (a job started with ``start_new_session``): MPICH's
    launcher gives each rank a process group of its own, so killing the launcher's group
    leaves the ranks running."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.getsid(int(entry)) == session:
                os.kill(int(entry), signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def run_ranks(
    nranks: int,
    script: os.PathLike | str,
    args: Sequence[str] = (),
    *,
    timeout: float = 120.0,
    env: Optional[Dict[str, str]] = None,
    expect_failure: Optional[bool] = False,
    prefix: Sequence[str] = (),
) -> subprocess.CompletedProcess:
    """Run ``python script *args`` on ``nranks`` ranks; assert it succeeded (or failed, with
    ``expect_failure``; ``None`` asserts neither, for rank programs that leave with
    ``os._exit`` and whose summaries are the verdict) and return the completed process (stdout
    and stderr as text). ``prefix``: a command that runs mpiexec (e.g. ``taskset -c 0``)."""
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), environment.get("PYTHONPATH")]))
    environment.setdefault("DENSECCL_TIMEOUT", "60")
    environment.update(env or {})
    command = [*prefix, mpiexec(), "-n", str(nranks), sys.executable, str(script), *map(str, args)]
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment, start_new_session=True
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_session(process.pid)
        stdout, stderr = process.communicate()
        raise AssertionError(
            f"{' '.join(command)} did not finish within {timeout} s\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
        ) from None
    result = subprocess.CompletedProcess(command, process.returncode, stdout, stderr)
    failed = process.returncode != 0
    if expect_failure is not None and failed != expect_failure:
        raise AssertionError(
            f"{' '.join(command)} exited with {process.returncode}\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
        )
    return result
