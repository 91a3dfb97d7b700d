"""How every rank program reports: it counts its checks and collects the failures instead of
stopping at the first, then prints one summary line per rank, which the tests read:

    [name] rank r/n: OK (k checks passed)
    [name] rank r/n: FAILED f (k checks)      followed by "  rank r: <failure>" lines

(:func:`expect_summaries` and :func:`expect_passed` read them: one summary from every rank,
each with at least one check and none failed.)
Rank programs run as scripts with the repository root on ``PYTHONPATH``, as the launchers in
``tests/support/ranks.py`` and ``tests/torch/launchers.py`` start them.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Any, Callable, List, Optional, Sequence, Tuple, Type, Union

#: how many failures a rank prints (the count in the summary line is complete)
SHOWN = 40


class Checker:
    """Checks of one rank of the program ``name``; end with :meth:`finish` or :meth:`done`."""

    def __init__(self, name: str, rank: int, size: int) -> None:
        self.name, self.rank, self.size = name, rank, size
        self.failures: List[str] = []
        self.checks = 0

    def check(self, condition: Any, message: str) -> bool:
        """Count a check; ``message`` is the failure when ``condition`` is false."""
        self.checks += 1
        if not condition:
            self.failures.append(message)
        return bool(condition)

    def tally(self, checks: int, failures: Sequence[str]) -> None:
        """Count ``checks`` made elsewhere (a test matrix that keeps its own tally), of which
        ``failures`` failed."""
        self.checks += checks
        self.failures.extend(failures)

    def fail(self, message: str) -> None:
        """A check that failed (a path that must not be taken, an unexpected exception)."""
        self.check(False, message)

    def raises(
        self,
        what: str,
        kinds: Union[Type[BaseException], Tuple[Type[BaseException], ...]],
        call: Callable[[], object],
        contains: str = "",
    ) -> Optional[BaseException]:
        """``call()`` must raise one of ``kinds`` whose message contains ``contains`` (lower
        case); the exception it raised, if any."""
        self.checks += 1
        try:
            call()
        except kinds as error:
            if contains and contains not in str(error).lower():
                self.failures.append(f"{what}: {type(error).__name__} without {contains!r}: {error}")
            return error
        except Exception as error:  # noqa: BLE001 - any other exception is this check's failure
            self.failures.append(f"{what}: raised {type(error).__name__}: {error}")
            return error
        self.failures.append(f"{what}: did not raise")
        return None

    def equal(
        self, what: str, got: Any, want: Any, *, strides: Optional[Sequence[int]] = None, tol: float = 1e-6
    ) -> None:
        """Two torch tensors hold the same values within ``tol``; with ``strides``, ``got``
        also has those strides (size-1 dims excepted; an empty tensor has any)."""
        import torch  # only torch rank programs compare tensors

        self.checks += 1
        if tuple(got.shape) != tuple(want.shape):
            self.failures.append(f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}")
            return
        if not torch.allclose(got.double(), want.double(), rtol=tol, atol=tol):
            self.failures.append(f"{what}: values differ\n got {got}\n want {want}")
        wrong_strides = strides is not None and _wildcarded(got.shape, got.stride()) != _wildcarded(got.shape, strides)
        if wrong_strides and got.numel() > 0:
            self.failures.append(f"{what}: strides {got.stride()} != {tuple(strides)}")

    def report(self) -> int:
        """Print this rank's summary line (and its failures); the exit status it calls for."""
        if self.failures:
            lines = [f"[{self.name}] rank {self.rank}/{self.size}: FAILED {len(self.failures)} ({self.checks} checks)"]
            lines += [f"  rank {self.rank}: {failure}" for failure in self.failures[:SHOWN]]
        else:
            lines = [f"[{self.name}] rank {self.rank}/{self.size}: OK ({self.checks} checks passed)"]
        print("\n".join(lines), flush=True)
        sys.stderr.flush()
        return 1 if self.failures else 0

    def finish(self, hard_exit: bool = False, before_exit: Optional[Callable[[], object]] = None) -> None:
        """Report, run ``before_exit`` (e.g. a final barrier), then exit. With ``hard_exit``
        the summary is out before any rank leaves: a rank leaving through ``os._exit`` may make
        mpiexec kill its peers at once."""
        code = self.report()
        if before_exit is not None:
            before_exit()
        if hard_exit:  # skip MPI_Finalize: peers may have abandoned requests (timeout tests)
            os._exit(code)
        sys.exit(code)

    def done(self) -> None:
        """Report as the program's last step: a failing rank leaves at once (``os._exit``: no
        teardown that could wait for peers), a passing one returns and ends normally."""
        if self.report():
            os._exit(1)


def _wildcarded(shape: Sequence[int], strides: Sequence[int]) -> Tuple[Optional[int], ...]:
    return tuple(None if n == 1 else s for n, s in zip(shape, strides))


def summaries(stdout: str, name: str = r"[^\]]+") -> List[Tuple[str, int, int, str, int]]:
    """Every summary line in ``stdout`` of a program called ``name`` (a pattern): (name, rank,
    size, "OK" or "FAILED f", checks). Lines of different ranks may run together in a
    launcher's merged output, so they are found by pattern, not by line."""
    found = re.findall(rf"\[({name})\] rank (\d+)/(\d+): (OK|FAILED \d+) \((\d+) checks(?: passed)?\)", stdout)
    return [(program, int(rank), int(size), status, int(checks)) for program, rank, size, status, checks in found]


def expect_summaries(stdout: str, name: str, nranks: int, stderr: str = "") -> None:
    """Each of ``nranks`` ranks of the program ``name`` printed one summary, and each passed
    at least one check: a rank that checked nothing fails. ``stderr``: its last lines go into
    the failure's message (a rank that printed nothing may have said why there)."""
    found = [line for line in summaries(stdout, re.escape(name)) if line[2] == nranks]
    said = f"\n--- stderr (the end)\n{stderr[-4000:]}" if stderr else ""
    assert sorted(rank for _, rank, _, _, _ in found) == list(range(nranks)), (
        f"expected one summary [{name}] from each of {nranks} ranks:\n{stdout}{said}"
    )
    assert all(status == "OK" and checks > 0 for _, _, _, status, checks in found), stdout + said


def expect_passed(result: Any, nranks: int) -> None:
    """:func:`expect_summaries` for a finished job (a ``CompletedProcess``) of one program,
    whatever its name."""
    names = {program for program, _, size, _, _ in summaries(result.stdout) if size == nranks}
    assert len(names) == 1, f"expected the summaries of one program on {nranks} ranks:\n{result.stdout}{result.stderr}"
    expect_summaries(result.stdout + "\n" + result.stderr, names.pop(), nranks)
