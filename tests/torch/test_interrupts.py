"""An interrupt (KeyboardInterrupt) in each wait of a collective on the gloo engine under
torchrun: the shared-memory engine's step (a repeated small in-place allreduce; a first-call
form's allreduce, allgather and reduce-scatter, their data in the step), the board's step of a
call through gloo, gloo's transfer, and the agreement over gloo with the board off. No rank
ever returns a value paired with another call's (tests/mpi/ranks/interrupts.py). Before
interrupts broke the communicator, an interrupted host-path call made rank 1 give 10 and get
1010: every later call paired one call off."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from tests.support.checker import expect_summaries
from tests.torch.launchers import run

PROGRAM = Path(__file__).parent.parent / "mpi" / "ranks" / "interrupts.py"
pytestmark = pytest.mark.torch
#: (the wait interrupted, the call's form, elements, board on)
CASES = [
    ("agreement", "inplace", 512, "1"),  # the host path
    ("agreement", "out", 512, "1"),  # shared memory, the data in the agreement step
    ("agreement", "allgather", 512, "1"),  # the same
    ("agreement", "reduce_scatter", 256, "1"),  # the same: the whole input, 2-3 blocks, fits a slot
    ("transfer", "out", 1 << 16, "1"),
    ("agreement", "inplace", 512, "0"),  # gloo's own agreement round: the news is a key on the store
    ("transfer", "out", 1 << 16, "0"),
]


@pytest.mark.timeout(150)
@pytest.mark.parametrize("ranks", [2, 3])
@pytest.mark.parametrize("wait,form,elements,shared", CASES, ids=[f"{w}-{f}-board{s}" for w, f, _, s in CASES])
def test_interrupt_in_a_wait(wait: str, form: str, elements: int, shared: str, ranks: int, tmp_path: Path) -> None:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks),
               str(PROGRAM), wait, form, str(elements)]
    done = run(command, timeout=120, expect_failure=None,
               env={"DENSECCL_SHARED_AGREEMENT": shared, "INTERRUPT_DIR": str(tmp_path)})
    expect_summaries(done.stdout, f"interrupts-{wait}", ranks, done.stderr)
