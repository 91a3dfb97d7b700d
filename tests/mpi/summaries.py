"""Reading the summary lines rank programs print (see tests/support/checker.py)."""

from __future__ import annotations

import re


def expect_summaries(stdout: str, name: str, nranks: int) -> None:
    """Every rank printed ``[name] rank r/n: OK (k checks passed)`` with k > 0. Lines of different
    ranks may run together in mpiexec's merged output, so they are found by pattern."""
    found = re.findall(rf"\[{re.escape(name)}\] rank (\d+)/(\d+): (OK|FAILED \d+) \((\d+) checks(?: passed)?\)", stdout)
    ranks = sorted(int(rank) for rank, size, status, checks in found if int(size) == nranks)
    assert ranks == list(range(nranks)), f"expected a summary from each of {nranks} ranks:\n{stdout}"
    assert all(status == "OK" and int(checks) > 0 for _, _, status, checks in found), stdout
