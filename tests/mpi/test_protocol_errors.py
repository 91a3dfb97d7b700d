"""A bad array-protocol object on one rank: LayoutError there naming it, MismatchError on every
other rank, nothing written, the communicator usable (tests/mpi/ranks/protocol_errors.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.checker import expect_summaries
from tests.support.ranks import run_ranks

pytestmark = pytest.mark.mpi

SCRIPT = Path(__file__).parent / "ranks" / "protocol_errors.py"


@pytest.mark.parametrize("nranks", [2, 3])
@pytest.mark.parametrize("shared_agreement", ["1", "0"], ids=["board", "mpi-allreduce"])
def test_a_bad_protocol_object_on_one_rank(nranks: int, shared_agreement: str) -> None:
    done = run_ranks(
        nranks, SCRIPT, timeout=120, env={"DENSECCL_TIMEOUT": "20", "DENSECCL_SHARED_AGREEMENT": shared_agreement}
    )
    expect_summaries(done.stdout, "protocol-errors", nranks)
