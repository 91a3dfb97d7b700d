import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Optional

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.support import segments  # noqa: E402 - needs the path above


#: the flight recorder's dump folder of this run (the recorder is on by default, and the fault
#: tests dump): made per run and removed after it, so that no dump is left in the temporary directory
_TRACES: list = []
#: every process this run starts, for the singletons' segments they may leave (set in pytest_configure)
DESCENDANTS: Optional[segments.Descendants] = None


def pytest_configure(config: pytest.Config) -> None:
    global DESCENDANTS
    if "DENSECCL_TRACE_DIR" not in os.environ:
        _TRACES.append(tempfile.mkdtemp(prefix="denseccl-test-traces-"))
        os.environ["DENSECCL_TRACE_DIR"] = _TRACES[0]
    if segments.SHM.is_dir() and DESCENDANTS is None:
        DESCENDANTS = segments.Descendants()


def pytest_unconfigure(config: pytest.Config) -> None:
    for folder in _TRACES:
        shutil.rmtree(folder, ignore_errors=True)
        os.environ.pop("DENSECCL_TRACE_DIR", None)


def finalize_mpi() -> None:
    """``MPI_Finalize`` now where this process became an MPI singleton (a test module imported
    mpi4py.MPI): its segment in /dev/shm goes with it here, whatever happens later at the
    interpreter's exit (mpi4py finalizes in a ``Py_AtExit`` hook, which a crash or ``os._exit``
    during teardown skips)."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.Finalize()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The run fails when a job it started, or any process it started, left MPI shared memory
    in /dev/shm: each job's runner removes its own (tests/support/segments.py), and a singleton
    (the test process itself, or a program a test ran without a launcher) must leave through
    ``MPI_Finalize``, so nothing of them may be there now. What is there is removed (unless a
    live process still maps it) and named, with the command that made it."""
    lines = []
    left = segments.left_by(segments.JOBS)
    if left:
        for job in segments.JOBS:
            job.remove(settle=2)
        still = segments.left_by(segments.JOBS)
        lines.append(f"{len(left)} MPI shared-memory segment(s) of this run's jobs were left in /dev/shm: "
                     f"{sorted(left)}")
        if still:
            lines.append("still mapped, so kept: " + "; ".join(segments.owners(still)))
    finalize_mpi()
    if DESCENDANTS is not None:
        DESCENDANTS.stop()
        strays = DESCENDANTS.segments()
        if strays:
            mapped = segments.mapped_segments()
            for name in set(strays) - mapped:
                (segments.SHM / name).unlink(missing_ok=True)
            lines.append(
                f"{len(strays)} MPI singleton segment(s) of this run's processes were left in /dev/shm: "
                + "; ".join(f"{name} (made by: {command})" for name, command in sorted(strays.items()))
            )
            if set(strays) & mapped:
                lines.append("still mapped, so kept: " + "; ".join(segments.owners(set(strays) & mapped)))
    if not lines:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    for line in lines:
        if reporter is not None:
            reporter.write_line(line, red=True)
        else:
            print(line, file=sys.stderr)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
