"""The package installs on a machine without a network (the GPU machines have none), and its
torch extra never asks pip to replace a torch the adapter supports.

- A build with the environment's own setuptools (``pip install --no-build-isolation``, what an
  offline machine must use: pip's isolated build would fetch setuptools) succeeds with no index
  and yields a wheel with every module of the checkout.
- ``denseccl[torch]`` admits torch 2.11 (the GPU machines' CUDA 13 build), the oldest torch the
  stand-in tests (tests/torch/test_torch_versions.py, test_torch_without_callback_work.py) keep
  working; a bound above it would make pip replace that torch by a PyPI build.
"""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = (ROOT / "pyproject.toml").read_text()


def _extra(name: str) -> list:
    block = PYPROJECT.split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
    found = re.search(rf"^{name} = \[(.*)\]$", block, re.M)
    assert found, f"no extra {name} in pyproject.toml"
    return [part.strip().strip('"') for part in found.group(1).split(",") if part.strip()]


def test_torch_extra_admits_the_gpu_machines_torch():
    specifiers = pytest.importorskip("packaging.specifiers")
    version = pytest.importorskip("packaging.version")
    (torch,) = _extra("torch")
    allowed = specifiers.SpecifierSet(torch.removeprefix("torch"))
    for installed in ("2.11.0+cu130", "2.11.0", "2.13.0+cpu"):
        assert allowed.contains(version.Version(installed)), f"{torch} would replace torch {installed}"
    assert not allowed.contains(version.Version("2.10.0")), f"{torch} admits torch 2.10, which no run tests"
    stand_in = (ROOT / "tests/torch/test_torch_versions.py").read_text()
    assert "TORCH_2_11_NAMES" in stand_in  # the stand-in of 2.11 that CI runs


def test_offline_build_with_the_environments_setuptools(tmp_path):
    """``pip wheel --no-build-isolation --no-index``: no network, the setuptools installed here."""
    setuptools = pytest.importorskip("setuptools")
    required = re.search(r'requires = \["setuptools>=(\d+)"\]', PYPROJECT)
    assert required, "the build requirement is not a plain setuptools lower bound"
    if int(setuptools.__version__.split(".")[0]) < int(required.group(1)):  # an old Python's venv (launch/versions)
        pytest.skip(f"this environment's setuptools {setuptools.__version__} is older than the build needs "
                    f"(>= {required.group(1)}): an offline build needs that one installed first")
    source = tmp_path / "src"
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    for name in files:
        path = ROOT / name
        if path.is_file() and not name.startswith(("tests/", "docs/", "examples/")):
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            (source / name).write_bytes(path.read_bytes())
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-index", "--no-deps", "-q",
         "--disable-pip-version-check", "-w", str(tmp_path / "dist"), str(source)],
        capture_output=True, text=True, timeout=300, env={"PATH": "/usr/bin:/bin", "PIP_NO_INDEX": "1"},
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    (wheel,) = (tmp_path / "dist").glob("denseccl-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        metadata = archive.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    wanted = {name for name in files if name.startswith("denseccl/") and name.endswith(".py")}
    assert wanted <= names, sorted(wanted - names)[:5]
    assert "Requires-Dist: torch>=2.11; extra == \"torch\"" in metadata, metadata[:2000]
