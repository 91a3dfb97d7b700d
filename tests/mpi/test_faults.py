"""Faults injected into real ranks: a peer stopped right after it posted a transfer, a late
peer, a peer that never calls or exits, objects dropped in every order, the abort policy.
After any fault: an error on every rank or a clean job abort; never a write to memory the
caller may have freed; never a silently wrong result (docs/faults.md)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.support.checker import expect_summaries
from tests.support.ranks import flavour, mpiexec, run_ranks

pytestmark = pytest.mark.mpi

RANKS = Path(__file__).parent / "ranks"
BOARD = {"1": "board", "0": "mpi"}


@pytest.mark.timeout(150)
@pytest.mark.parametrize("shared", ["1", "0"], ids=BOARD.get)
@pytest.mark.parametrize("scenario", ["sync", "split", "plan", "plan-bcast", "async", "torch-async"])
def test_peer_stopped_after_posting(scenario, shared):
    if scenario.startswith("torch"):
        pytest.importorskip("torch")
    env = {"DENSECCL_SHARED_AGREEMENT": shared}
    if scenario.startswith("torch"):  # overrides torch's timeout (run_ranks sets 60)
        env["DENSECCL_TIMEOUT"] = "2"
    if scenario == "plan-bcast" and flavour(mpiexec()) == "openmpi":
        # Open MPI's receivers copy a large message straight out of the sender's memory (CMA
        # single copy), so the broadcast completes on them while its root is stopped, and the
        # pause is no fault. Without single copy the root must send, as under MPICH.
        env["OMPI_MCA_smsc"] = "^cma"
    done = run_ranks(2, RANKS / "faults.py", [scenario, "2"], timeout=120, env=env, expect_failure=None)
    expect_summaries(done.stdout, f"faults-{scenario}", 2)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("shared", ["1", "0"], ids=BOARD.get)
def test_late_rank_never_agrees_with_an_abandoned_entry(shared):
    env = {"DENSECCL_SHARED_AGREEMENT": shared}
    done = run_ranks(2, RANKS / "stale.py", ["6"], timeout=120, env=env, expect_failure=None)
    expect_summaries(done.stdout, "stale", 2)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("order", ["work-first", "array-first", "comm-first", "comm-only", "exit", "exit-global"])
def test_drops_in_any_order(order):
    done = run_ranks(2, RANKS / "drops.py", [order], timeout=120)
    expect_summaries(done.stdout, f"drops-{order}", 2)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("shared", ["1", "0"], ids=BOARD.get)
@pytest.mark.parametrize("order", ["close-then-wait", "close-times-out"])
def test_close_with_work_in_flight(order, shared):
    env = {"DENSECCL_SHARED_AGREEMENT": shared}
    done = run_ranks(2, RANKS / "drops.py", [order], timeout=120, env=env)
    expect_summaries(done.stdout, f"drops-{order}", 2)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["env", "kwarg"])
def test_abort_on_timeout_ends_the_job(how):
    started = time.monotonic()
    env = {"DENSECCL_ON_TIMEOUT": "abort"} if how == "env" else {}
    done = run_ranks(2, RANKS / "on_timeout.py", [how, "2", "60"], timeout=100, env=env, expect_failure=True)
    assert time.monotonic() - started < 40, "the job was not aborted: it waited for the sleeping rank"
    assert "NOT ABORTED" not in done.stdout
    assert "aborting the whole job" in done.stderr and "did not complete within the timeout" in done.stderr


@pytest.mark.timeout(120)
@pytest.mark.parametrize("shared, path", [("1", "shared-memory board"), ("0", "MPI allreduce")], ids=["board", "mpi"])
def test_debug_log_names_the_agreement_path_and_each_call(shared, path):
    env = {"DENSECCL_DEBUG": "TRACE", "DENSECCL_SHARED_AGREEMENT": shared}
    done = run_ranks(2, RANKS / "logging_calls.py", timeout=90, env=env)
    expect_summaries(done.stdout, "logging", 2)
    assert f"INFO agreement step: {path}" in done.stderr, done.stderr
    calls = [line for line in done.stderr.splitlines() if "TRACE allreduce op=sum float32 shape (4, 3)" in line]
    repeated = sum("(repeated)" in line for line in calls)
    assert len(calls) == 6 and repeated == 4 and all(" us" in line for line in calls), calls


@pytest.mark.timeout(120)
@pytest.mark.parametrize("cleanup", [True, False], ids=["launcher-ends-job", "survivor-goes-on"])
def test_peer_exits(cleanup):
    if not cleanup and flavour(mpiexec()) == "openmpi":
        pytest.skip("hydra's -disable-auto-cleanup keeps the survivor running; Open MPI's launcher ends the job")
    started = time.monotonic()
    flags = () if cleanup else ("-disable-auto-cleanup",)
    done = run_ranks(2, RANKS / "peer_exits.py", ["3"], timeout=90, mpiexec_flags=flags, expect_failure=None)
    assert time.monotonic() - started < 60
    assert "returned although" not in done.stdout and "a later call returned" not in done.stdout
    if not cleanup:
        expect_summaries(done.stdout, "peer_exits", 2)
