"""Run torch's own distributed backend conformance suite (``DistributedTest._DistTestBase`` from
``torch/testing/_internal/distributed/distributed_test.py``, shipped in the wheel) against a
backend, and write one JSON record per test: outcome (passed, failed, skipped), detail (the
failing ranks' tracebacks or the skip reason) and seconds.

Upstream drives the suite with ``test/distributed/test_distributed_spawn.py`` (not in the
wheel): env ``BACKEND``, ``WORLD_SIZE``, ``TEMP_DIR``, file:// init, one fresh process per rank
per test. This driver does the same with two ways of starting the ranks:

* torch's launcher (default): ``MultiProcessTestCase`` starts ``WORLD_SIZE`` processes per test,
  forked (``DENSECCL_SUITE_START=fork``, the default: about 0.3 s per test instead of about 10 s,
  since a forked rank does not import torch again) or spawned as upstream does
  (``DENSECCL_SUITE_START=spawn``). No MPI launcher: CPU tensors take denseccl's non-MPI engine.
* ``mpiexec -n N python driver.py --mpi``: each MPI process is one rank and runs the selected
  tests one after another (init, test body, destroy, exactly what a spawned rank does), so CPU
  tensors take denseccl's MPI transport. Ranks agree on each test's outcome over MPI.

How the suite is made to test a backend that is not gloo (torch is not edited):

* The suite decides at import time, from ``BACKEND``, which tests are skipped. It is imported
  with ``BACKEND=gloo``, so a denseccl run is decorated exactly as the gloo run it is compared
  with; afterwards the module's ``BACKEND`` is the real backend's name, so test bodies (which
  check names, create groups, read ``dist.get_backend()``) see denseccl.
* ``cases.UNSKIP``: tests that gloo's decoration skips only because of the backend's name
  although denseccl provides the feature (CPU all-to-all is gated on ``BACKEND == "mpi"``).
* ``cases.BODY_AS_GLOO``: tests whose body picks its CPU code path by ``BACKEND in ("mpi",
  "gloo")`` and has none for other names; their body sees ``"gloo"`` (the group is denseccl).

Settings come from the environment so that spawned ranks, which import this module again, see
the same: ``DENSECCL_SUITE_BACKEND`` (``denseccl`` or ``gloo``, for the baseline), ``WORLD_SIZE``
(torch's launcher; under mpiexec the MPI size), ``DENSECCL_SUITE_START``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
import unittest
from datetime import timedelta
from typing import Any, Dict, List, Optional

BACKEND = os.environ.get("DENSECCL_SUITE_BACKEND", "denseccl")
UNDER_MPI = "--mpi" in sys.argv[1:]
if UNDER_MPI:
    from mpi4py import MPI

    os.environ["WORLD_SIZE"] = str(MPI.COMM_WORLD.Get_size())
os.environ.setdefault("WORLD_SIZE", "2")
os.environ.setdefault("TEMP_DIR", tempfile.gettempdir())
# A test that hangs is stopped after this many seconds (torch's default is 300).
os.environ.setdefault("DISTRIBUTED_TESTS_DEFAULT_TIMEOUT", "120")
os.environ["BACKEND"] = "gloo"
# As upstream's run_test.py runs it "with file init_method": the suite reads INIT_METHOD when it
# is imported (a test that re-creates the default group needs file://); each test's own file is
# set in its ranks (``_init_method``); a spawned rank arrives with it already.
if not os.environ.get("INIT_METHOD", "").startswith("file://"):
    os.environ["INIT_METHOD"] = "file://" + os.path.join(tempfile.gettempdir(), "denseccl-suite-unused")
os.environ.setdefault("PYTORCH_PRINT_REPRO_ON_FAILURE", "0")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.testing._internal import common_utils  # noqa: E402
from torch.testing._internal.common_distributed import TEST_SKIPS, DistTestCases  # noqa: E402

if BACKEND == "denseccl":
    import denseccl.torch  # noqa: F401  (registers the backend)

    DistTestCases.backend_feature["plugin"].add(BACKEND)

from torch.testing._internal.distributed import distributed_test as suite  # noqa: E402

from cases import BODY_AS_GLOO, UNSKIP  # noqa: E402  (beside this file)

os.environ["BACKEND"] = BACKEND
suite.BACKEND = BACKEND

def _unskipped(name: str) -> Any:
    """The suite's test ``name`` as a method unittest does not skip (the function is shared with
    torch's class, so its skip marks are left alone and a new function calls it)."""
    original = getattr(suite.DistributedTest._DistTestBase, name)

    def test(self: Any) -> Any:
        return original(self)

    test.__name__ = test.__qualname__ = name
    test.__doc__ = original.__doc__
    return test


class TestDistBackendWithSpawn(suite.TestDistBackend, suite.DistributedTest._DistTestBase):
    """The class upstream's test_distributed_spawn.py defines, with the ranks forked or spawned."""

    def setUp(self) -> None:
        super().setUp()
        if os.environ.get("DENSECCL_SUITE_START", "fork") == "spawn":
            self._spawn_processes()
        else:
            self._start_processes(torch.multiprocessing.get_context("fork").Process)

    def run_test(self, test_name: str, parent_pipe: Any) -> None:
        _init_method()
        suite.BACKEND = "gloo" if test_name in BODY_AS_GLOO else BACKEND
        super().run_test(test_name, parent_pipe)


if BACKEND != "gloo":
    for _name, _reason in UNSKIP.items():
        if getattr(getattr(suite.DistributedTest._DistTestBase, _name), "__unittest_skip_why__", None) == _reason:
            setattr(TestDistBackendWithSpawn, _name, _unskipped(_name))


def _init_method() -> None:
    """The file:// URL of this test's temporary directory (``initialize_temp_directories`` puts
    it in the environment of each test) as the suite's ``INIT_METHOD``."""
    suite.INIT_METHOD = os.environ["INIT_METHOD"]


def skip_reason(name: str) -> Optional[str]:
    """Why unittest would skip the test before starting ranks, or None."""
    method = getattr(TestDistBackendWithSpawn, name)
    if getattr(TestDistBackendWithSpawn, "__unittest_skip__", False) or getattr(method, "__unittest_skip__", False):
        return getattr(method, "__unittest_skip_why__", "skipped")
    return None


# -- torch's launcher ------------------------------------------------------------------------


class Recorder(unittest.TextTestResult):
    """Records each test's outcome and writes the JSON file after every test (a run that is
    killed keeps what it finished)."""

    def __init__(self, *args: Any, out: Optional[str] = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.records: Dict[str, Dict[str, Any]] = {}
        self.out = out
        self._started = 0.0

    def startTest(self, test: Any) -> None:  # noqa: N802 - unittest's name
        self._started = time.monotonic()
        super().startTest(test)

    def _record(self, test: Any, outcome: str, detail: str = "") -> None:
        name = test.id().rsplit(".", 1)[-1]
        seconds = round(time.monotonic() - self._started, 2)
        self.records[name] = {"outcome": outcome, "detail": detail, "seconds": seconds}
        if self.out:
            write(self.out, self.records)

    def addSuccess(self, test: Any) -> None:  # noqa: N802
        super().addSuccess(test)
        self._record(test, "passed")

    def addFailure(self, test: Any, err: Any) -> None:  # noqa: N802
        super().addFailure(test, err)
        self._record(test, "failed", self._exc_info_to_string(err, test))

    def addError(self, test: Any, err: Any) -> None:  # noqa: N802
        super().addError(test, err)
        self._record(test, "failed", self._exc_info_to_string(err, test))

    def addSkip(self, test: Any, reason: str) -> None:  # noqa: N802
        super().addSkip(test, reason)
        self._record(test, "skipped", reason)


def run_with_torch_launcher(names: List[str], out: Optional[str]) -> None:
    tests = unittest.TestSuite(TestDistBackendWithSpawn(name) for name in names)
    unittest.TextTestRunner(resultclass=lambda *a, **k: Recorder(*a, out=out, **k), verbosity=2).run(tests)


# -- mpiexec ---------------------------------------------------------------------------------


def _run_rank(case: Any, name: str, rank: int, size: int) -> Dict[str, str]:
    """What one spawned rank does for a test (``TestDistBackend._run`` and ``run_test``), with the
    outcome returned instead of an exit code."""
    seconds = suite.CUSTOM_PG_TIMEOUT.get(name, suite.default_pg_timeout)
    suite.BACKEND = BACKEND
    try:
        dist.init_process_group(
            init_method=case.init_method, backend=BACKEND, world_size=size, rank=rank,
            timeout=timedelta(seconds=seconds),
        )
        case._barrier()
        common_utils.set_rng_seed()
        suite.BACKEND = "gloo" if name in BODY_AS_GLOO else BACKEND
        getattr(case, name)()
        suite.BACKEND = BACKEND
        case._barrier()
        return {"outcome": "passed", "detail": ""}
    except unittest.SkipTest as skip:
        return {"outcome": "skipped", "detail": str(skip)}
    except SystemExit as leaving:
        for skip in TEST_SKIPS.values():
            if leaving.code == skip.exit_code:
                return {"outcome": "skipped", "detail": skip.message}
        if not leaving.code:
            return {"outcome": "passed", "detail": ""}
        return {"outcome": "failed", "detail": f"rank {rank} exited with code {leaving.code}"}
    except BaseException:  # noqa: BLE001 - every failure is the test's result
        return {"outcome": "failed", "detail": f"rank {rank}:\n{traceback.format_exc()}"}
    finally:
        suite.BACKEND = BACKEND
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001 - a failed test may leave a group that cannot close cleanly
                pass


def _combine(outcomes: List[Dict[str, str]]) -> Dict[str, str]:
    """One outcome from every rank's, as MultiProcessTestCase does: a failure anywhere fails the
    test; otherwise rank 0 decides whether it was skipped."""
    failed = [o["detail"] for o in outcomes if o["outcome"] == "failed"]
    if failed:
        return {"outcome": "failed", "detail": "\n".join(failed)}
    return dict(outcomes[0])


def _fresh_temp_dir() -> str:
    """What ``initialize_temp_directories`` makes for each test: barrier/, test_dir/, init_dir/."""
    temp = tempfile.mkdtemp(prefix="denseccl-suite-")
    for sub in ("barrier", "test_dir", "init_dir"):
        os.mkdir(os.path.join(temp, sub))
    return temp


def run_under_mpi(names: List[str], out: Optional[str]) -> None:
    world = MPI.COMM_WORLD.Dup()
    rank, size = world.Get_rank(), world.Get_size()
    records: Dict[str, Dict[str, Any]] = {}
    environment = dict(os.environ)
    for name in names:
        started = time.monotonic()
        # a rank process runs many tests: each starts from the environment (and the debug level
        # read from it) that a fresh process would have; some tests change and do not restore it
        os.environ.clear()
        os.environ.update(environment)
        dist.set_debug_level_from_env()
        reason = skip_reason(name)
        if reason is not None:
            outcome = {"outcome": "skipped", "detail": reason}
        else:
            temp = world.bcast(_fresh_temp_dir() if rank == 0 else None, root=0)
            os.environ["TEMP_DIR"] = temp
            os.environ["INIT_METHOD"] = "file://" + os.path.join(temp, "init_dir", "shared_init_file")
            _init_method()
            suite.Barrier.barrier_id = 0
            case = TestDistBackendWithSpawn(name)
            case.rank, case.file_name = rank, os.path.join(temp, "init_dir", "store")
            outcomes = world.gather(_run_rank(case, name, rank, size), root=0)
            outcome = _combine(outcomes) if rank == 0 else {}
            world.Barrier()
            if rank == 0:
                shutil.rmtree(temp, ignore_errors=True)
        if rank == 0:
            records[name] = dict(outcome, seconds=round(time.monotonic() - started, 2))
            print(f"{name} ... {outcome['outcome']}", flush=True)
            if out:
                write(out, records)


def write(path: str, records: Dict[str, Dict[str, Any]]) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(records, f, indent=1)
    os.replace(path + ".tmp", path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mpi", action="store_true", help="each MPI process is one rank (start with mpiexec)")
    parser.add_argument("--out", help="write the records (JSON) here")
    parser.add_argument("--list", action="store_true", help="print the suite's test names and exit")
    parser.add_argument("tests", nargs="*", help="test names (default: all)")
    args = parser.parse_args()
    names = unittest.TestLoader().getTestCaseNames(TestDistBackendWithSpawn)
    if args.list:
        print("\n".join(names))
        return
    unknown = sorted(set(args.tests) - set(names))
    if unknown:
        raise SystemExit(f"not in torch's suite: {', '.join(unknown)}")
    selected = args.tests or list(names)
    (run_under_mpi if args.mpi else run_with_torch_launcher)(selected, args.out)


if __name__ == "__main__":
    main()
