"""The benchmark on real ranks: the CLI verifies every row (#wrong == 0 in --json), rows stream
as they complete, the header and JSON say what the run ran on, --pin pins, a missing plotting
library stops the run before it starts, warnings stay out of the table, and no in-place path
allocates a temporary as large as its input (tracemalloc)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

from tests.support.checker import expect_summaries
from tests.support.ranks import ROOT, launch, mpiexec, run_ranks
from tests.support.segments import Job

pytestmark = pytest.mark.mpi
RANKS = Path(__file__).parent / "ranks"


def test_bench_cli_rows_are_all_right(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    done = run_ranks(
        2,
        RANKS / "bench_cli.py",
        [
            "--collective",
            "all",
            "-d",
            "float,half,int32",
            "-o",
            "sum,avg",
            "-b",
            "1K",
            "-e",
            "16K",
            "-f",
            "16",
            "-n",
            "2",
            "-w",
            "1",
            "--rounds",
            "2",
            "--layouts",
            "all",
            "--agreement",
            "on,off",
            "--contenders",
            "denseccl,mpi4py,naive",
            "--memcheck",
            "--json",
            str(out),
        ],
        timeout=240,
    )
    assert "Avg bus bandwidth" in done.stdout and "Out of bounds values : 0 OK" in done.stdout
    data = json.loads(out.read_text())
    rows = data["rows"]
    meta = data["meta"]
    assert meta["nranks"] == 2 and meta["hosts"] == 1 and meta["ranks_per_host"] == 2 and meta["check"] == 1
    for name in ("denseccl", "numpy", "mpi4py", "torch", "cupy", "MPI library", "NCCL"):
        assert meta["versions"][name], name
    assert meta["versions"]["MPI library"].startswith(("MPICH", "Open MPI")), meta["versions"]
    assert "#  versions: denseccl " in done.stdout and "#  MPI library: " in done.stdout
    assert "#  hosts 1 " in done.stdout and "ranks per host 2" in done.stdout
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
    done = run_ranks(1, RANKS / "bench_cli.py", ["--collective", "alltoall"], expect_failure=True, timeout=60)
    assert "unknown" in done.stderr
    done = run_ranks(1, RANKS / "bench_cli.py", ["-c", "all"], expect_failure=True, timeout=60)
    assert "--collective" in done.stderr  # -c is nccl-tests' check count, and the message says where the selector went


SMALL = [
    "-b",
    "4K",
    "-e",
    "4K",
    "-n",
    "2",
    "-w",
    "1",
    "--rounds",
    "1",
    "--layouts",
    "contiguous,channels_last",
    "--contenders",
    "denseccl",
]


def test_check_zero_skips_the_check(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    done = run_ranks(2, RANKS / "bench_cli.py", [*SMALL, "-c", "0", "-a", "3", "--json", str(out)], timeout=120)
    rows = json.loads(out.read_text())["rows"]
    assert rows and all(r["wrong"] is None and r["time_us"] > 0 for r in rows)
    assert "Out of bounds values : N/A OK" in done.stdout and "average 3 (max)" in done.stdout


def test_missing_plot_library_stops_the_run_before_it_starts(tmp_path: Path) -> None:
    done = run_ranks(
        2,
        RANKS / "bench_cli.py",
        [*SMALL, "--plot", str(tmp_path / "x.png")],
        env={"BENCH_HIDE": "matplotlib"},
        expect_failure=True,
        timeout=120,
    )
    assert done.returncode == 2 and "needs matplotlib" in done.stderr and "nothing was run" in done.stderr
    assert "all_reduce" not in done.stdout and not (tmp_path / "x.png").exists()


@pytest.mark.parametrize("pin, expected", [("0", ["0", "0"]), ("core", ["0", "1"])])
def test_pin(tmp_path: Path, pin: str, expected: List[str]) -> None:
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 usable CPUs")
    out = tmp_path / "bench.json"
    done = run_ranks(2, RANKS / "bench_cli.py", [*SMALL, "--pin", pin, "--json", str(out)], timeout=120)
    assert json.loads(out.read_text())["meta"]["affinity"] == expected
    assert f"--pin {pin}" in done.stdout
    bad = run_ranks(2, RANKS / "bench_cli.py", [*SMALL, "--pin", "4096"], expect_failure=True, timeout=120)
    assert "not usable" in bad.stderr and "all_reduce" not in bad.stdout


def test_warnings_stay_out_of_the_table() -> None:
    """Built without the compiled half kernels, the fallback warns once per rank, after the
    footer, and nothing of it lands among the rows."""
    args = [*SMALL, "-d", "half", "--layouts", "contiguous"]
    hide = {"BENCH_HIDE": "denseccl.backends.mpi._half_kernels"}
    done = run_ranks(2, RANKS / "bench_cli.py", args, env=hide, timeout=120)
    assert done.stderr.count("HalfKernelsWarning") == 2, done.stderr  # once on each rank
    assert "denseccl.bench: warning during the run" in done.stderr
    assert "Warning" not in done.stdout


def _stream(args: List[str], timeout: float) -> Tuple[List[Tuple[float, str, bool]], str, int]:
    """Run the bench on 2 ranks; every stdout line with when it arrived and whether the job was
    still running then."""
    environment: Dict[str, str] = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), environment.get("PYTHONPATH")]))
    prefix, needs = launch(mpiexec(), 2)  # Open MPI needs options and, as root, variables
    environment.update(needs)
    command = [*prefix, sys.executable, str(RANKS / "bench_cli.py"), *args]
    job = Job(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment)
    process = job.process
    lines: List[Tuple[float, str, bool]] = []
    start = time.monotonic()
    try:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append((time.monotonic() - start, line.rstrip("\n"), process.poll() is None))
            if time.monotonic() - start > timeout:
                raise AssertionError(f"{command} ran over {timeout} s")
        stderr = process.stderr.read() if process.stderr else ""
        return lines, stderr, process.wait(timeout=timeout)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        job.finish()


def test_rows_stream_as_they_complete_and_progress_goes_to_stderr() -> None:
    """The 4 KiB row must reach the reader while the 16 MiB size is still being timed."""
    lines, stderr, status = _stream(
        [
            "-b",
            "4K",
            "-e",
            "16M",
            "-f",
            "4096",
            "-n",
            "20",
            "-w",
            "1",
            "--rounds",
            "3",
            "--layouts",
            "contiguous,channels_last",
            "--contenders",
            "denseccl",
            "--progress",
            "0.2",
        ],
        timeout=200,
    )
    assert status == 0, stderr
    first = next((when, alive) for when, line, alive in lines if line.split()[:1] == ["4096"])
    last = next(when for when, line, _ in lines if line.split()[:1] == ["16777216"])
    assert first[1], "the first row arrived only when the job had ended"
    assert last - first[0] > 0.1
    assert "denseccl.bench: " in stderr and "timing round" in stderr  # progress, on stderr only
    assert not any("timing round" in line for _, line, _ in lines)


def test_in_place_paths_allocate_no_large_temporary() -> None:
    done = run_ranks(2, RANKS / "memcheck.py", timeout=240)
    expect_summaries(done.stdout, "memcheck", 2)
