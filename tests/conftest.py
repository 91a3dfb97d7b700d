import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.support import segments  # noqa: E402 - needs the path above


#: the flight recorder's dump folder of this run (the recorder is on by default, and the fault
#: tests dump): made per run and removed after it, so that no dump is left in the temporary directory
_TRACES: list = []


def pytest_configure(config: pytest.Config) -> None:
    if "DENSECCL_TRACE_DIR" not in os.environ:
        _TRACES.append(tempfile.mkdtemp(prefix="denseccl-test-traces-"))
        os.environ["DENSECCL_TRACE_DIR"] = _TRACES[0]


def pytest_unconfigure(config: pytest.Config) -> None:
    for folder in _TRACES:
        shutil.rmtree(folder, ignore_errors=True)
        os.environ.pop("DENSECCL_TRACE_DIR", None)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The run fails when a job it started left MPI shared memory in /dev/shm: each job's
    runner removes its own (tests/support/segments.py), so nothing of them may be there now.
    What is there is removed (unless a live process still maps it) and named."""
    left = segments.left_by(segments.JOBS)
    if not left:
        return
    for job in segments.JOBS:
        job.remove(settle=2)
    still = segments.left_by(segments.JOBS)
    lines = [f"{len(left)} MPI shared-memory segment(s) of this run's jobs were left in /dev/shm: {sorted(left)}"]
    if still:
        lines.append("still mapped, so kept: " + "; ".join(segments.owners(still)))
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    for line in lines:
        if reporter is not None:
            reporter.write_line(line, red=True)
        else:
            print(line, file=sys.stderr)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
