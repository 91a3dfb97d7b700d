"""An interrupt (KeyboardInterrupt) in each wait of a collective, injected into real ranks under
mpiexec, on the board and on MPI's own agreement: no rank ever returns a value paired with
another call's, the interrupted rank's communicator is broken, and every peer raises
(tests/mpi/ranks/interrupts.py). Before interrupts broke the communicator, an interrupted
in-place call on the board made the next calls return their peers' values one call off."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.checker import expect_summaries
from tests.support.ranks import run_ranks

pytestmark = pytest.mark.mpi

PROGRAM = Path(__file__).parent / "ranks" / "interrupts.py"
#: (the wait interrupted, the call's form)
WAITS = [("agreement", "inplace"), ("agreement", "out"), ("transfer", "out")]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("ranks", [2, 3])
@pytest.mark.parametrize("shared", ["1", "0"], ids={"1": "board", "0": "mpi"}.get)
@pytest.mark.parametrize("wait,form", WAITS, ids=[f"{w}-{f}" for w, f in WAITS])
def test_interrupt_in_a_wait(wait: str, form: str, shared: str, ranks: int, tmp_path: Path) -> None:
    done = run_ranks(ranks, PROGRAM, [wait, form, 512], timeout=100, expect_failure=None,
                     env={"DENSECCL_SHARED_AGREEMENT": shared, "INTERRUPT_DIR": str(tmp_path)})
    expect_summaries(done.stdout, f"interrupts-{wait}", ranks, done.stderr)
