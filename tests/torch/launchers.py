"""Start real ranks with torch's own launchers in a subprocess, with a hard time limit:
``torchrun --standalone --nproc-per-node N`` and plain ``python`` (for programs that call
``torch.multiprocessing.spawn`` themselves). On a timeout the whole process group is killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import Dict, Optional, Sequence

from tests.support.ranks import ROOT

#: variables that would make a rank believe an MPI launcher started it
MPI_VARIABLES = ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALNRANKS")


def run(
    command: Sequence[str],
    *,
    timeout: float,
    env: Optional[Dict[str, str]] = None,
    expect_failure: Optional[bool] = False,
) -> subprocess.CompletedProcess:
    """Run ``command``; assert it succeeded (or failed, with ``expect_failure``; None asserts
    neither, for programs whose printed verdicts decide)."""
    environment = {k: v for k, v in os.environ.items() if k not in MPI_VARIABLES}
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), environment.get("PYTHONPATH")]))
    environment.setdefault("DENSECCL_TIMEOUT", "60")
    environment["PYTHONWARNINGS"] = "ignore"
    environment.update(env or {})
    process = subprocess.Popen(
        list(command),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environment,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        raise AssertionError(
            f"{' '.join(command)} did not finish within {timeout} s\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
        ) from None
    finally:
        try:  # ranks torchrun left behind (it kills its workers, but not on every path)
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if expect_failure is not None and (process.returncode != 0) != expect_failure:
        raise AssertionError(
            f"{' '.join(command)} exited with {process.returncode}\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
        )
    return subprocess.CompletedProcess(list(command), process.returncode, stdout, stderr)


def torchrun(n: int, script: os.PathLike | str, args: Sequence[str] = (), **kwargs) -> subprocess.CompletedProcess:
    """``torchrun --standalone --nproc-per-node n script args``."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(n),
        str(script),
        *map(str, args),
    ]
    return run(command, **kwargs)


def python(script: os.PathLike | str, args: Sequence[str] = (), **kwargs) -> subprocess.CompletedProcess:
    """``python script args`` (a program that spawns its own ranks)."""
    return run([sys.executable, str(script), *map(str, args)], **kwargs)
