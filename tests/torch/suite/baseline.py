"""The reference list: which tests of torch's suite gloo passes on CPU here, per world size.

``python -m tests.torch.suite.baseline`` runs the suite with gloo on 2, 3 and 4 ranks (ranks
forked by torch, about 5 minutes) and rewrites ``gloo_baseline.json``; the long run of
test_torch_suite.py checks that the stored list is still what gloo does.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from tests.support.segments import Job

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
DRIVER = HERE / "driver.py"
STORED = HERE / "gloo_baseline.json"
WORLD_SIZES = (2, 3, 4)


def run_driver(
    backend: str,
    world_size: int,
    names: Sequence[str],
    *,
    mpiexec: Optional[str] = None,
    start: str = "fork",
    timeout: float = 1800.0,
) -> Dict[str, Dict[str, object]]:
    """Run ``names`` of torch's suite with ``backend`` on ``world_size`` ranks (started by torch,
    or by ``mpiexec`` when its path is given) and return the records of the tests that finished.
    On timeout the whole process group is killed; the records then lack the test that hung."""
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), environment.get("PYTHONPATH")]))
    environment.update(DENSECCL_SUITE_BACKEND=backend, WORLD_SIZE=str(world_size), DENSECCL_SUITE_START=start)
    # the suite passes each group's timeout through torch; a global override would change what it tests
    environment.pop("DENSECCL_TIMEOUT", None)
    with tempfile.TemporaryDirectory(prefix="denseccl-suite-") as scratch:
        out = os.path.join(scratch, "records.json")
        command = [sys.executable, str(DRIVER), "--out", out, *names]
        if mpiexec is not None:
            command = [mpiexec, "-n", str(world_size), sys.executable, str(DRIVER), "--mpi", "--out", out, *names]
        log = open(os.path.join(scratch, "log"), "w+")
        job = Job(command, stdout=log, stderr=subprocess.STDOUT, env=environment, cwd=scratch)
        process = job.process
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        finally:
            job.finish()
        records: Dict[str, Dict[str, object]] = {}
        if os.path.exists(out):
            with open(out) as f:
                records = json.load(f)
        if process.returncode != 0 or len(records) < len(names):
            log.seek(0)
            tail = log.read()[-6000:]
            for name in names:
                if name not in records:
                    detail = f"the run ended before this test finished (exit {process.returncode}):\n{tail}"
                    records[name] = {"outcome": "failed", "detail": detail, "seconds": 0}
                    break
        log.close()
    return records


def passed(records: Dict[str, Dict[str, object]]) -> List[str]:
    return sorted(name for name, record in records.items() if record["outcome"] == "passed")


def suite_names() -> List[str]:
    """Every test name of torch's suite (as unittest lists them)."""
    environment = dict(os.environ, DENSECCL_SUITE_BACKEND="gloo", WORLD_SIZE="2")
    command = [sys.executable, str(DRIVER), "--list"]
    result = subprocess.run(command, capture_output=True, text=True, env=environment, check=True)
    return result.stdout.split()


@functools.lru_cache(maxsize=1)
def stored() -> Dict[str, object]:
    """The stored reference list (read once)."""
    with open(STORED) as f:
        return json.load(f)


def main() -> None:
    import torch

    names = suite_names()
    data: Dict[str, object] = {"torch": torch.__version__.split("+")[0], "tests": len(names)}
    for n in WORLD_SIZES:
        records = run_driver("gloo", n, names)
        data[str(n)] = passed(records)
        print(f"gloo on {n} ranks: {len(data[str(n)])} of {len(names)} passed", flush=True)
    with open(STORED, "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
