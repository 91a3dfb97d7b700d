"""torch's own distributed backend conformance suite (``DistributedTest._DistTestBase`` in
``torch/testing/_internal/distributed/distributed_test.py``) against the denseccl backend.

The reference is gloo on CPU: ``gloo_baseline.json`` lists the tests gloo passes here on 2, 3
and 4 ranks (``python -m tests.torch.suite.baseline`` regenerates it). Every one of them must
pass on denseccl, except ``EXCLUDED`` below (each with its reason), and so must the tests that
gloo's decoration skips only for the backend's name where denseccl provides the feature
(``cases.UNSKIP``: CPU all-to-all). One pytest item per (engine, world size, test):

* engine ``torch``: the ranks are started by torch's ``MultiProcessTestCase``, as upstream's
  ``test_distributed_spawn.py`` does (file:// init, no MPI launcher: CPU tensors take denseccl's
  non-MPI engine); forked by default, spawned with ``DENSECCL_SUITE_START=spawn`` (10-30 s per
  test instead of about 1: every rank imports torch again).
* engine ``mpiexec``: ``mpiexec -n N``, each MPI rank runs the tests one after another (CPU
  tensors take denseccl's MPI transport).

Default run (CI, about 5 minutes on 2 busy shared cores): both engines run every test on 2 ranks;
engine torch on 3 and 4 ranks runs one third of the tests, a slice that rotates daily
(``DENSECCL_SUITE_SLICE=0|1|2`` picks one); engine mpiexec on 3 and 4 ranks runs only in the long
run. The other items are skipped, saying why. Long run: ``DENSECCL_SUITE=full`` runs every test on
both engines and 2, 3 and 4 ranks, and checks that gloo still passes exactly the stored baseline
(about 19 minutes on 2 busy shared cores).

What passing means: torch's suite checks results for most collectives, but its all_reduce tests
(``_test_all_reduce_helper``) compare no values, only profiler events and only for torch's own
backends; denseccl's own rank tests (tests/torch/ranks/) check every result against a reference.
"""

from __future__ import annotations

import datetime
import os
import sys
from typing import Dict, List, Tuple

import pytest

pytest.importorskip("torch")
pytest.importorskip("expecttest")

from tests.support.ranks import mpiexec
from tests.torch.suite import baseline
from tests.torch.suite.cases import UNSKIP

pytestmark = [pytest.mark.torch]

_GLOO_ONLY = "monitored_barrier is implemented by gloo only (torch refuses other backends)"
_SPARSE = "sparse tensors: denseccl is a backend of dense (strided) tensors"

#: Tests gloo passes that cannot apply to denseccl, a backend of dense tensors: test -> reason.
EXCLUDED: Dict[str, str] = {
    # torch.distributed.monitored_barrier raises "monitored_barrier is only implemented for GLOO
    # backend" for any other backend (ProcessGroupGloo::monitoredBarrier): gloo-only by design.
    "test_monitored_barrier_gloo": _GLOO_ONLY,
    "test_monitored_barrier_gloo_rank_0_timeout": _GLOO_ONLY,
    "test_monitored_barrier_gloo_subgroup": _GLOO_ONLY,
    # all_reduce of a torch.sparse_coo tensor: denseccl moves strided (dense) tensors only.
    "test_sparse_all_reduce_sum": _SPARSE,
}

ENGINES = ("torch", "mpiexec")
WORLD_SIZES = baseline.WORLD_SIZES
SLICES = 3
FULL = os.environ.get("DENSECCL_SUITE", "") == "full"
#: (engine, world size) that run every test by default; the others run one slice.
EVERY_TEST_BY_DEFAULT = {("torch", 2), ("mpiexec", 2)}
#: (engine, world size) that run nothing by default.
OFF_BY_DEFAULT = {("mpiexec", 3), ("mpiexec", 4)}


def today_slice(engine: str, n: int) -> int:
    chosen = os.environ.get("DENSECCL_SUITE_SLICE")
    if chosen is not None:
        return int(chosen) % SLICES
    return (datetime.date.today().toordinal() + n + ENGINES.index(engine)) % SLICES


def not_run_because(engine: str, n: int, index: int) -> str:
    """Why the default run leaves this item out ("" if it runs)."""
    if FULL or (engine, n) in EVERY_TEST_BY_DEFAULT:
        return ""
    if (engine, n) in OFF_BY_DEFAULT:
        return "runs only in the long run (DENSECCL_SUITE=full)"
    if index % SLICES != today_slice(engine, n):
        return (
            f"not in today's slice of the default run (DENSECCL_SUITE_SLICE picks one of {SLICES}; "
            "DENSECCL_SUITE=full runs all)"
        )
    return ""


def expected(n: int) -> List[str]:
    """The tests that must pass on ``n`` ranks: gloo's and the un-skipped ones, sorted."""
    return sorted(set(baseline.stored()[str(n)]) | set(UNSKIP))


def cases() -> List[Tuple[str, int, str]]:
    return [(engine, n, name) for engine in ENGINES for n in WORLD_SIZES for name in expected(n)]


_records: Dict[Tuple[str, int], Dict[str, Dict[str, object]]] = {}


def records_for(session: pytest.Session, engine: str, n: int) -> Dict[str, Dict[str, object]]:
    """Run (once per session) every selected, not excluded test of this engine and world size
    in one driver process, and return the records."""
    key = (engine, n)
    if key not in _records:
        names = []
        for item in session.items:
            params = getattr(getattr(item, "callspec", None), "params", {})
            if (params.get("engine"), params.get("n")) == key and params["name"] not in EXCLUDED:
                if not not_run_because(engine, n, expected(n).index(params["name"])):
                    names.append(params["name"])
        start = os.environ.get("DENSECCL_SUITE_START", "fork")
        per_test = 20 if start == "fork" or engine == "mpiexec" else 60
        launcher = mpiexec() if engine == "mpiexec" else None
        _records[key] = baseline.run_driver(
            "denseccl", n, names, mpiexec=launcher, start=start, timeout=120 + per_test * len(names)
        )
    return _records[key]


@pytest.mark.timeout(7200)
@pytest.mark.parametrize(("engine", "n", "name"), cases(), ids=lambda v: str(v))
def test_suite(request: pytest.FixtureRequest, engine: str, n: int, name: str) -> None:
    if name in EXCLUDED:
        pytest.skip(f"excluded: {EXCLUDED[name]}")
    reason = not_run_because(engine, n, expected(n).index(name))
    if reason:
        pytest.skip(reason)
    if engine == "mpiexec" and sys.platform != "linux":
        pytest.skip("the mpiexec engine runs on Linux")
    record = records_for(request.session, engine, n).get(name)
    assert record is not None, f"{name} did not run: the driver stopped before it (see the test it stopped at)"
    outcome, detail = record["outcome"], str(record["detail"])
    if name in UNSKIP and outcome == "skipped" and detail != UNSKIP[name]:
        pytest.skip(f"skipped by torch's suite on {n} ranks: {detail}")
    assert outcome == "passed", f"{name} on {n} ranks ({engine}): {outcome}\n{detail}"


@pytest.mark.timeout(7200)
@pytest.mark.parametrize("n", WORLD_SIZES)
def test_gloo_baseline_is_current(n: int) -> None:
    """gloo still passes exactly the stored reference list (torch or the machine changed if not)."""
    if not FULL:
        pytest.skip("runs only in the long run (DENSECCL_SUITE=full)")
    stored = baseline.stored()
    import torch

    if stored["torch"] != torch.__version__.split("+")[0]:
        pytest.skip(f"the baseline is for torch {stored['torch']}; regenerate it: python -m tests.torch.suite.baseline")
    names = baseline.suite_names()
    got = baseline.passed(baseline.run_driver("gloo", n, names, timeout=120 + 20 * len(names)))
    want = stored[str(n)]
    gained, lost = sorted(set(got) - set(want)), sorted(set(want) - set(got))
    assert got == want, f"gloo on {n} ranks now passes {gained} and no longer {lost}"


def test_exclusions_name_tests_of_the_suite() -> None:
    """Every exclusion names a test gloo passes, every un-skipped name one of torch's suite (a
    rename upstream must not leave a stale entry)."""
    stored = baseline.stored()
    assert not set(EXCLUDED) - {name for n in WORLD_SIZES for name in stored[str(n)]}
    assert not set(UNSKIP) - set(baseline.suite_names())
