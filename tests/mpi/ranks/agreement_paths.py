"""Rank program: the agreement step under stress, on the path the environment selects (the
shared-memory board, or the MPI allreduce with DENSECCL_SHARED_AGREEMENT=0).

Usage: agreement_paths.py EXPECT_BOARD(0|1) ITERATIONS

A seeded schedule, the same on every rank, decides per call whether all ranks agree, one rank
passes another shape, or one rank's input is read-only; calls alternate between the parent
communicator, a split of it and the control channel's step itself (with tags, equal everywhere
or not), and between the plan fast path and the full path. Every outcome is checked against the
schedule: results against NumPy, errors on every rank, untouched buffers after an error.
"""

from __future__ import annotations

import sys
import time

import numpy as np

import denseccl
from denseccl.channel.base import DIFFERENT, MIXED_TAGS, SAME
from tests.support.checker import Checker

expect_board, iterations = sys.argv[1] == "1", int(sys.argv[2])
comm = denseccl.init()
rank, size = comm.rank, comm.size
checker = Checker(f"agreement-paths-{int(expect_board)}", rank, size)
checker.check(
    (comm.control.board is not None) == expect_board,
    f"board in use: {comm.control.board is not None}, expected {expect_board}",
)

sub = comm.split(rank % 2, rank)
checker.check((sub.control.board is not None) == (expect_board and sub.size > 1), "the split's board")
schedule = np.random.default_rng(20261202)


def one_call(group: denseccl.Communicator, step: int, scenario: str, culprit: int, shape: tuple) -> None:
    me = group.rank
    base = np.full(shape, float(me + 1 + step % 5))
    x = base.copy()
    if scenario == "shape" and me == culprit:
        x = np.full(shape + (1, 2), float(me + 1))  # another shape: every rank must raise
        base = x.copy()
    if scenario == "readonly" and me == culprit:
        x.flags.writeable = False
    try:
        got = group.allreduce(x)
    except denseccl.MismatchError:
        checker.check(
            scenario == "shape" or (scenario == "readonly" and me != culprit),
            f"step {step}: unexpected MismatchError ({scenario})",
        )
        checker.check(np.array_equal(x, base), f"step {step}: a buffer was written before the error")
        return
    except denseccl.LayoutError:
        checker.check(scenario == "readonly" and me == culprit, f"step {step}: unexpected LayoutError ({scenario})")
        checker.check(np.array_equal(x, base), f"step {step}: the read-only input changed")
        return
    if group.size == 1:  # nobody to disagree with: the sum of one
        checker.check(got is x and np.array_equal(x, base), f"step {step}: a one-rank sum changed its input")
        return
    want = sum(float(r + 1 + step % 5) for r in range(group.size))
    checker.check(scenario == "agree", f"step {step}: no error raised ({scenario}, culprit {culprit})")
    checker.check(got is x and np.array_equal(x, np.full(shape, want)), f"step {step}: wrong sum")


started = time.monotonic()
for step in range(iterations):
    which = schedule.integers(0, 3)
    scenario = ("agree", "agree", "shape", "readonly")[schedule.integers(0, 4)]
    shape = ((4, 3), (2, 2, 2), (5,))[schedule.integers(0, 3)]  # repeats: the plan fast path
    if which == 2:  # the control channel's step itself: random values, some equal everywhere
        values = schedule.integers(-(2**62), 2**62, size=size)
        same_everywhere = schedule.integers(0, 2) == 1
        invalid_rank = schedule.integers(-1, size)
        value = int(values[0] if same_everywhere else values[rank])
        tags = schedule.integers(-1, 3, size=size)  # the tag: equal everywhere or not
        deadline = time.monotonic() + 30
        answer = comm.control.all_equal(value, rank == invalid_rank, deadline, int(tags[rank]))
        agreed = (same_everywhere or len(set(values.tolist())) == 1) and invalid_rank < 0
        expected = (MIXED_TAGS if len(set(tags.tolist())) > 1 else SAME) if agreed else DIFFERENT
        checker.check(answer == expected, f"step {step}: all_equal said {answer}, expected {expected}")
        continue
    group = comm if which == 0 else sub
    culprit = int(schedule.integers(0, group.size)) if group is comm else int(schedule.integers(0, 8)) % group.size
    one_call(group, step, scenario, culprit, shape)
checker.check(time.monotonic() - started < 120, "the schedule took longer than two minutes")
comm.close()
sub.close()
checker.finish()
