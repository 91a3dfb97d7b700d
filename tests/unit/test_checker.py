"""The rank programs' Checker and the tests that read its summary lines agree: a passing rank
is counted, a failing one is not, and a failure's message reaches the output."""

from __future__ import annotations

import subprocess

import pytest

from tests.support.checker import expect_summaries
from tests.support.checker import Checker, expect_passed


def summaries(capsys, outcomes):
    """The output of one rank per entry of ``outcomes`` (True: its check passes)."""
    for rank, passes in enumerate(outcomes):
        check = Checker("demo", rank, len(outcomes))
        check.check(passes, f"rank {rank}'s check")
        assert check.report() == (0 if passes else 1)
    return capsys.readouterr().out


def test_passing_ranks_are_counted(capsys):
    out = summaries(capsys, [True, True])
    expect_summaries(out, "demo", 2)
    assert out.count("checks passed") == 2


def test_a_failing_rank_is_not(capsys):
    out = summaries(capsys, [True, False])
    with pytest.raises(AssertionError):
        expect_summaries(out, "demo", 2)
    assert out.count("checks passed") == 1 and "rank 1's check" in out


def test_raises_and_fail(capsys):
    check = Checker("demo", 0, 1)
    assert isinstance(check.raises("wanted", ValueError, lambda: int("x"), "invalid literal"), ValueError)
    check.raises("not raised", ValueError, lambda: None)
    check.raises("other kind", KeyError, lambda: int("x"))
    check.fail("by hand")
    assert check.checks == 4 and len(check.failures) == 3
    assert check.report() == 1
    out = capsys.readouterr().out
    assert "[demo] rank 0/1: FAILED 3 (4 checks)" in out and "not raised: did not raise" in out


def test_finish_exits_with_the_verdict(capsys):
    check = Checker("demo", 0, 1)
    check.fail("no")
    with pytest.raises(SystemExit) as leaving:
        check.finish()
    assert leaving.value.code == 1


def test_a_rank_with_no_checks_fails(capsys):
    """A summary of 0 checks is no pass, read either way."""
    for rank in range(2):
        Checker("demo", rank, 2).report()
    out = capsys.readouterr().out
    assert out.count("OK (0 checks passed)") == 2
    with pytest.raises(AssertionError):
        expect_summaries(out, "demo", 2)
    with pytest.raises(AssertionError):
        expect_passed(subprocess.CompletedProcess([], 0, out, ""), 2)


def test_expect_passed_wants_every_rank_once(capsys):
    out = summaries(capsys, [True, True])
    expect_passed(subprocess.CompletedProcess([], 0, out, ""), 2)
    with pytest.raises(AssertionError):  # a rank missing
        expect_passed(subprocess.CompletedProcess([], 0, out, ""), 3)
    with pytest.raises(AssertionError):  # a rank failed
        expect_passed(subprocess.CompletedProcess([], 0, summaries(capsys, [True, False]), ""), 2)
