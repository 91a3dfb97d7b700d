"""Start real ranks with mpiexec in a subprocess, with a hard time limit.

Rank programs are ordinary Python files that exit non-zero (an uncaught exception, e.g. a
failed assert) when a check fails; ``run_ranks`` turns that into a test failure that shows
every rank's output. A test that starts mpiexec itself builds its command with
``launch(mpiexec(), n)``, so that it runs under any MPI the suite is run with (``DENSECCL_MPI``,
``DENSECCL_TEST_MPIEXEC``), and starts it as a ``tests.support.segments.Job``, which removes
the MPI library's shared memory its ranks leave behind.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from tests.support.segments import Job, kill_session

ROOT = Path(__file__).resolve().parents[2]


def mpiexec() -> str:
    """The mpiexec the rank tests start: ``DENSECCL_TEST_MPIEXEC`` when set (e.g. a cluster's
    module-loaded one), else the one beside the running interpreter (the venv's), else the one
    on PATH."""
    chosen = os.environ.get("DENSECCL_TEST_MPIEXEC")
    if chosen:
        found = shutil.which(chosen)
        if found is None:
            raise RuntimeError(f"DENSECCL_TEST_MPIEXEC={chosen!r} is not an executable")
        return found
    beside = Path(sys.executable).with_name("mpiexec")
    if beside.exists():
        return str(beside)
    found = shutil.which("mpiexec")
    if found is None:
        raise RuntimeError("no mpiexec: install the mpi extra (pip install 'denseccl[mpi]') or run launch/setup")
    return found


@functools.lru_cache(maxsize=None)
def flavour(path: str) -> str:
    """"openmpi" or "mpich" (hydra, and launchers that take its options), from ``--version``."""
    text = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60).stdout
    return "openmpi" if re.search(r"Open MPI|OpenRTE|PRRTE", text) else "mpich"


def launch(path: str, nranks: int) -> Tuple[List[str], Dict[str, str]]:
    """The command prefix that starts ``nranks`` local ranks with the mpiexec at ``path``, and
    the environment it needs. Open MPI refuses more ranks than cores without
    ``--oversubscribe``, and refuses to run as root without its two variables."""
    if flavour(path) == "openmpi":
        env = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"} if os.geteuid() == 0 else {}
        return [path, "--oversubscribe", "-n", str(nranks)], env
    return [path, "-n", str(nranks)], {}


def run_ranks(
    nranks: int,
    script: os.PathLike | str,
    args: Sequence[str] = (),
    *,
    timeout: float = 120.0,
    env: Optional[Dict[str, str]] = None,
    expect_failure: Optional[bool] = False,
    mpiexec_flags: Sequence[str] = (),
    launcher: Sequence[str] = (),
) -> subprocess.CompletedProcess:
    """Run ``python script *args`` on ``nranks`` ranks; assert it succeeded (or failed, with
    ``expect_failure``; ``None`` asserts neither, for rank programs that leave with
    ``os._exit`` and whose summaries are the verdict) and return the completed process (stdout
    and stderr as text). ``launcher``: a command that runs mpiexec (e.g. ``taskset -c 0``)."""
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), environment.get("PYTHONPATH")]))
    environment.setdefault("DENSECCL_TIMEOUT", "60")
    prefix, needs = launch(mpiexec(), nranks)
    environment.update(needs)
    environment.update(env or {})
    command = [*launcher, prefix[0], *mpiexec_flags, *prefix[1:], sys.executable, str(script), *map(str, args)]
    job = Job(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment)
    process = job.process
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_session(process.pid)
        stdout, stderr = process.communicate()
        raise AssertionError(
            f"{' '.join(command)} did not finish within {timeout} s\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
        ) from None
    finally:
        job.finish()
    result = subprocess.CompletedProcess(command, process.returncode, stdout, stderr)
    failed = process.returncode != 0
    if expect_failure is not None and failed != expect_failure:
        raise AssertionError(
            f"{' '.join(command)} exited with {process.returncode}\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
        )
    return result
