"""tests/gpu/run.sh on the CPU (DENSECCL_GPU_DRY=1 carries on past the missing GPU): every step
runs or is skipped with its reason (tests/gpu/probe.py's probes once, for all), nothing
crashes, at most 8 files are left in $OUT (the device tool brings back no more), and
summary.txt ends with the line the docs quote."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
def test_run_script_dry(tmp_path):
    env = {
        **os.environ,
        "OUT": str(tmp_path),
        "DENSECCL_GPU_DRY": "1",
        "DENSECCL_GPU_BUDGET": "240",
        "DENSECCL_PYTHON": sys.executable,
    }
    process = subprocess.run(
        ["bash", str(ROOT / "tests/gpu/run.sh")], cwd=str(ROOT), env=env, capture_output=True, text=True, timeout=280,
        start_new_session=True,
    )  # fmt: skip
    log = process.stdout + process.stderr
    files = sorted(path.name for path in tmp_path.iterdir())
    assert len(files) <= 8 and {"summary.txt", "versions.txt", "tests.txt", "run.log"} <= set(files), files
    summary = (tmp_path / "summary.txt").read_text().splitlines()
    assert re.fullmatch(r"gpu: \d+ passed, [1-9]\d* failed", summary[-1]), summary[-3:]
    assert process.returncode == 1, log[-3000:]
    text = "\n".join(summary)
    assert "FAIL environment" in text
    # the offline build passes with the setuptools the build needs (pyproject.toml: >= 77), and
    # fails only with an older one or none (a 3.12+ venv has none): the script's own Python's
    offline = next(line for line in summary if "install offline" in line)
    if not offline.startswith("PASS install offline: pip wheel --no-build-isolation --no-index with setuptools"):
        found = re.match(r"FAIL install offline with setuptools (\S+):", offline)
        assert found and (found.group(1) == "none" or int(found.group(1).split(".")[0]) < 77), offline
    environment = next(line for line in summary if line.startswith("FAIL environment"))
    assert "No module named" not in environment and "nccl backend cannot run here" in environment, environment
    assert "pytest single:" in text  # ran: every GPU test skipped without a GPU
    probes = [line for line in summary if "probe" in line and "two-rank" not in line]
    assert len(probes) == 1 and probes[0].startswith("SKIP probes: the nccl backend cannot run here"), probes
    assert "SKIP pytest ranks" in text or "FAIL two-rank probe" in text
    tests = (tmp_path / "tests.txt").read_text()
    assert "SKIPPED" in tests and "test_gpu_single" in tests
    assert "cupy:" in (tmp_path / "versions.txt").read_text()
