"""Start real ranks with torch's own launchers in a subprocess, with a hard time limit:
``torchrun --standalone --nproc-per-node N`` and plain ``python`` (for programs that call
``torch.multiprocessing.spawn`` themselves). On a timeout the whole process group is killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import Dict, Optional, Sequence

from denseccl.config import MPI_LAUNCH_VARIABLES
from tests.support.ranks import ROOT
from tests.support.segments import Job



def run(
    command: Sequence[str],
    *,
    timeout: float,
    env: Optional[Dict[str, str]] = None,
    expect_failure: Optional[bool] = False,
) -> subprocess.CompletedProcess:
    """Run ``command``; assert it succeeded (or failed, with ``expect_failure``; None asserts
    neither, for programs whose printed verdicts decide)."""
    # no rank may believe that an MPI launcher started it
    environment = {k: v for k, v in os.environ.items() if k not in MPI_LAUNCH_VARIABLES}
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), environment.get("PYTHONPATH")]))
    environment.setdefault("DENSECCL_TIMEOUT", "60")
    environment["PYTHONWARNINGS"] = "ignore"
    environment.update(env or {})
    job = Job(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment)
    process = job.process
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        raise AssertionError(
            f"{' '.join(command)} did not finish within {timeout} s\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
        ) from None
    finally:  # kills the ranks torchrun left behind (it kills its workers, but not on every path)
        job.finish()
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
