"""``DENSECCL_DEBUG``: a real 2-rank job logs its bootstrap decisions at INFO, each line naming
its rank; without the variable it logs nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.checker import expect_summaries
from tests.support.ranks import run_ranks

pytestmark = pytest.mark.mpi
PROGRAM = Path(__file__).parent / "ranks" / "debug_log.py"


def test_info_names_bootstrap_decisions_on_every_rank() -> None:
    done = run_ranks(2, PROGRAM, env={"DENSECCL_DEBUG": "INFO"}, timeout=120)
    expect_summaries(done.stdout, "debug_log", 2)
    for rank in (0, 1):
        lines = [line for line in done.stderr.splitlines() if line.startswith(f"[denseccl rank {rank} ")]
        text = "\n".join(lines)
        assert "INFO init: backend mpi, from the argument" in text, done.stderr
        assert "INFO init: agreement check always (from DENSECCL_CHECK or the default), timeout 60 s" in text
        assert f"INFO init: mpi: rank {rank} of 2 on host " in text, done.stderr
        assert "float16/bfloat16 reductions on " in text, done.stderr


def test_quiet_without_the_variable() -> None:
    done = run_ranks(2, PROGRAM, env={"DENSECCL_DEBUG": "WARN"}, timeout=120)
    expect_summaries(done.stdout, "debug_log", 2)
    assert "[denseccl rank" not in done.stderr, done.stderr
