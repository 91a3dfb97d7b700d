"""Docs-ready output of tests/gpu/run.sh (standard library only: it must run before anything
else works).

usage:
  python tests/gpu/report.py versions                      GPU, driver, CUDA, NCCL, CuPy, torch, MPI
  python tests/gpu/report.py tests XML...                  every test's outcome, one line each
  python tests/gpu/report.py count STEPS XML...            the last line of summary.txt:
                                                           "gpu: N passed, M failed"
  python tests/gpu/report.py merge-json OUT NAME=FILE...   one JSON object of several files

STEPS is run.sh's file of steps that are not pytest tests ("PASS name: detail", "FAIL ...",
"SKIP ..."). N and M count every pytest test case (skips apart) and every such step; a pytest
run that left no junit XML (killed at its time cap) counts as one failure, named in STEPS.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
import xml.etree.ElementTree as ElementTree
from typing import Dict, Iterator, List, Tuple


def _try(what: str, thunk) -> str:
    try:
        return str(thunk())
    except Exception as error:  # noqa: BLE001 - a report names what it could not read
        return f"unknown ({type(error).__name__}: {str(error)[:120]})"


def _nccl_string(code: int) -> str:
    if code >= 10000:
        return f"{code // 10000}.{code // 100 % 100}.{code % 100}"
    return f"{code // 1000}.{code // 100 % 10}.{code % 100}"


def versions() -> List[str]:
    lines = [f"python: {sys.version.split()[0]} ({sys.executable})"]

    def smi() -> str:
        query = ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,compute_cap", "--format=csv,noheader"]
        found = subprocess.run(query, capture_output=True, text=True, timeout=30, check=True)
        return "; ".join(found.stdout.strip().splitlines())

    lines.append(f"gpu (nvidia-smi: name, driver, memory, compute capability): {_try('nvidia-smi', smi)}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            import cupy
            from cupy.cuda import nccl
        except Exception as error:  # noqa: BLE001
            lines.append(f"cupy: not importable ({type(error).__name__}: {error})")
            cupy = nccl = None
    if cupy is not None:
        runtime = cupy.cuda.runtime
        lines.append(f"cupy: {cupy.__version__}")
        cuda = f"{_try('runtime', runtime.runtimeGetVersion)}; driver API: {_try('driver', runtime.driverGetVersion)}"
        lines.append(f"cuda runtime (cupy): {cuda}")
        lines.append(f"gpus visible: {_try('count', runtime.getDeviceCount)}")
        version = _try("nccl", lambda: _nccl_string(nccl.get_version()) if nccl.available else "not available")
        lines.append(f"nccl (cupy.cuda.nccl.get_version): {version}")
    try:
        import torch

        lines.append(f"torch: {torch.__version__} (cuda {torch.version.cuda}, available {torch.cuda.is_available()})")
        version = _try("torch nccl", lambda: ".".join(map(str, torch.cuda.nccl.version())))
        lines.append(f"nccl (torch.cuda.nccl.version): {version}")
    except Exception as error:  # noqa: BLE001
        lines.append(f"torch: not importable ({type(error).__name__}: {error})")
    for name in ("numpy", "ml_dtypes", "mpi4py", "pytest"):
        lines.append(f"{name}: {_try(name, lambda n=name: __import__(n).__version__)}")
    library = _try("mpi", lambda: __import__("mpi4py.MPI", fromlist=["MPI"]).Get_library_version().splitlines()[0])
    lines.append(f"mpi library: {library}")
    return lines


def _cases(paths: List[str]) -> Iterator[Tuple[str, str, float, str]]:
    """(outcome, test id, seconds, message) of every test case in the junit files."""
    for path in paths:
        if not os.path.exists(path):
            continue
        for case in ElementTree.parse(path).getroot().iter("testcase"):
            module, name = case.get("classname") or "", case.get("name") or "?"
            test = f"{module.replace('.', '/')}.py::{name}" if module else f"{name.replace('.', '/')}.py (module)"
            outcome, message = "PASSED", ""
            for tag, name in (("failure", "FAILED"), ("error", "ERROR"), ("skipped", "SKIPPED")):
                found = case.find(tag)
                if found is not None:
                    outcome = name
                    message = (found.get("message") or found.text or "").strip().splitlines()[0:1]
                    message = message[0][:200] if message else ""
                    break
            yield outcome, test, float(case.get("time") or 0.0), message


def tests(paths: List[str]) -> List[str]:
    lines = []
    for outcome, test, seconds, message in _cases(paths):
        lines.append(f"{outcome:8} {test} ({seconds:.1f} s){' - ' + message if message else ''}")
    return lines or ["no test results (no junit XML was written)"]


def count(steps: str, paths: List[str]) -> Tuple[int, int, int]:
    passed = failed = skipped = 0
    for outcome, _, _, _ in _cases(paths):
        if outcome == "PASSED":
            passed += 1
        elif outcome == "SKIPPED":
            skipped += 1
        else:
            failed += 1
    if os.path.exists(steps):
        with open(steps, encoding="utf-8") as handle:
            for line in handle:
                word = line.split(" ", 1)[0]
                passed += word == "PASS"
                failed += word == "FAIL"
                skipped += word == "SKIP"
    return passed, failed, skipped


def merge_json(target: str, pairs: List[str]) -> None:
    merged: Dict[str, object] = {}
    for pair in pairs:
        name, _, path = pair.partition("=")
        if os.path.exists(path):
            with open(path, encoding="utf-8") as handle:
                try:
                    merged[name] = json.load(handle)
                except ValueError as error:
                    merged[name] = f"unreadable: {error}"
    with open(target, "w", encoding="utf-8") as handle:
        json.dump(merged, handle, indent=1)


def main(argv: List[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    command, rest = argv[0], argv[1:]
    if command == "versions":
        print("\n".join(versions()))
    elif command == "tests":
        print("\n".join(tests(rest)))
    elif command == "count":
        passed, failed, skipped = count(rest[0], rest[1:])
        print(f"skipped: {skipped}")
        print(f"gpu: {passed} passed, {failed} failed")
    elif command == "merge-json":
        merge_json(rest[0], rest[1:])
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
