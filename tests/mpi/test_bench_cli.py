"""The benchmark on real ranks: the CLI verifies every row (#wrong == 0 in --json), and no
in-place path allocates a temporary as large as its input (tracemalloc)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.ranks import run_ranks

pytestmark = pytest.mark.mpi
RANKS = Path(__file__).parent / "ranks"


def test_bench_cli_rows_are_all_right(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    done = run_ranks(
        2, RANKS / "bench_cli.py",
        ["-c", "all", "-d", "float,half,int32", "-o", "sum,avg", "-b", "1K", "-e", "16K", "-f", "16", "-n", "2", "-w", "1",
         "--rounds", "2", "--layouts", "all", "--check", "on,off", "--contenders", "denseccl,mpi4py,naive",
         "--memcheck", "--json", str(out)],
        timeout=240,
    )
    assert "Avg bus bandwidth" in done.stdout and "Out of bounds values : 0 OK" in done.stdout
    data = json.loads(out.read_text())
    rows = data["rows"]
    assert data["meta"]["nranks"] == 2
    assert rows and all(row.get("error") is None for row in rows), [r for r in rows if r.get("error")]
    assert all(row["wrong"] == 0 for row in rows)
    seen = {(r["collective"], r["layout"], r["contender"]) for r in rows}
    for collective in ("allreduce", "reduce", "broadcast", "allgather", "reduce_scatter"):
        for layout in ("contiguous", "channels_last", "transposed", "reversed"):
            assert (collective, layout, "denseccl") in seen and (collective, layout, "denseccl-nocheck") in seen
        assert (collective, "contiguous", "mpi4py") in seen and (collective, "reversed", "naive") in seen
    for r in rows:
        assert r["time_us"] > 0 and r["busbw"] >= 0 and len(r["rounds_us"]) == 2
        if r["contender"].startswith("denseccl"):
            assert r["peak_bytes"] is not None


def test_bench_cli_rejects_bad_options() -> None:
    done = run_ranks(1, RANKS / "bench_cli.py", ["-c", "alltoall"], expect_failure=True, timeout=60)
    assert "unknown" in done.stderr


def test_in_place_paths_allocate_no_large_temporary() -> None:
    done = run_ranks(2, RANKS / "memcheck.py", timeout=240)
    assert done.stdout.count("memcheck OK") == 2, done.stdout
