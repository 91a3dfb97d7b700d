"""The shared-memory arrival board (denseccl/channel/board.py) in one process: ranks as
threads over one shared page. Real ranks use it in tests/mpi/test_agreement_paths.py."""

from __future__ import annotations

import mmap
import threading
import time

import pytest

from denseccl import config
from denseccl.errors import CollectiveTimeoutError, CommunicatorBrokenError
from denseccl.channel import board as board_module
from denseccl.channel.base import DIFFERENT, MIXED_TAGS, SAME
from denseccl.channel.board import Board, page_bytes


def boards(size: int) -> list:
    page = mmap.mmap(-1, page_bytes(size))
    return [Board(page, rank, size) for rank in range(size)]


def run_together(members: list, calls: list) -> list:
    """calls[i][r] = (value, invalid) of rank r's i-th call; each rank's answers, by rank."""
    answers = [[] for _ in members]

    def rank_thread(rank: int) -> None:
        for call in calls:
            value, invalid = call[rank]
            answers[rank].append(members[rank].all_equal(value, invalid, time.monotonic() + 30))

    threads = [threading.Thread(target=rank_thread, args=(rank,)) for rank in range(len(members))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return answers


@pytest.mark.parametrize("size", [2, 3, 4])
def test_every_rank_gets_the_same_answer(size: int) -> None:
    calls = []
    expected = []
    for step in range(300):
        values = [step * 7 - 1000] * size
        invalid = [False] * size
        kind = step % 4
        if kind == 1:
            values[step % size] += 1  # one rank differs
        elif kind == 2:
            invalid[(step // 4) % size] = True
        elif kind == 3:
            values = [-(2**63), 2**63 - 1] * size  # extremes, alternating by rank
            values = values[:size]
        calls.append(list(zip(values, invalid)))
        expected.append(len(set(values)) == 1 and not any(invalid))
    answers = run_together(boards(size), calls)
    assert all(answer == expected for answer in answers)


@pytest.mark.parametrize("size", [2, 3])
def test_tags_answer_apart_from_the_values(size: int) -> None:
    members = boards(size)
    cases = [  # (values, tags, invalid rank) -> answer
        ([5] * size, [3] * size, None, SAME),
        ([5] * size, [3] * (size - 1) + [0], None, MIXED_TAGS),
        ([5] * size, [-1] + [0] * (size - 1), None, MIXED_TAGS),
        ([5] * (size - 1) + [6], [3] * size, None, DIFFERENT),
        ([5] * size, [3] * (size - 1) + [4], 0, DIFFERENT),
    ]
    answers = [[] for _ in members]

    def rank_thread(rank: int) -> None:
        for values, tags, invalid, _ in cases:
            answer = members[rank].all_equal(values[rank], invalid == rank, time.monotonic() + 30, tags[rank])
            answers[rank].append(answer)

    threads = [threading.Thread(target=rank_thread, args=(rank,)) for rank in range(size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert all(answer == [case[3] for case in cases] for answer in answers), answers


def test_a_peer_that_never_arrives_times_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(config, "BOARD_SPINS", 100)  # read at construction
    lonely = boards(2)[0]
    started = time.monotonic()
    with pytest.raises(CollectiveTimeoutError, match="agreement step did not complete"):
        lonely.all_equal(5, False, time.monotonic() + 0.3)
    assert 0.3 <= time.monotonic() - started < 15  # not before the deadline; the bound only catches a hang


def test_a_peer_that_gave_up_fails_the_wait_at_once() -> None:
    """Rank 0 gave up on call 1 (a timeout): rank 1, arriving late at that call, must not agree
    with rank 0's entry nor wait out its own timeout."""
    first, second = boards(2)
    assert first.gave_up() is None and second.gave_up() is None
    first.give_up()
    assert second.gave_up() == 0 and first.gave_up() == 0
    started = time.monotonic()
    with pytest.raises(CommunicatorBrokenError, match="rank 0 gave up"):
        second.all_equal(5, False, time.monotonic() + 30)
    assert time.monotonic() - started < 15  # well before its own 30 s timeout, however loaded the machine


class Owner:
    """Stands in for what provides a board's page on real ranks (an MPI window, a mapping):
    counts how often it is told the board closed."""

    def __init__(self) -> None:
        self.unlocked = 0

    def close(self) -> None:
        self.unlocked += 1

    def retire(self) -> None:
        pass


def test_close_is_local_and_idempotent() -> None:
    """One rank closes alone (no peer takes part), releases its own views of the page and its
    page's owner once; a second close does nothing; the peer's board is untouched."""
    page = mmap.mmap(-1, page_bytes(2))
    window = Owner()
    peer, member = Board(page, 0, 2), Board(page, 1, 2, owner=window)
    member.close()
    assert window.unlocked == 1
    with pytest.raises(ValueError, match="released"):
        member.gave_up()
    member.close()
    assert window.unlocked == 1
    peer.give_up()
    assert peer.gave_up() == 0
    with pytest.raises(BufferError):  # the peer still holds views of the page
        page.close()
    peer.close()
    page.close()  # no view of it is left


@pytest.mark.parametrize("word, on", [("0", False), ("off", False), ("1", True), ("", True)])
def test_environment_switch(monkeypatch: pytest.MonkeyPatch, word: str, on: bool) -> None:
    monkeypatch.setenv("DENSECCL_SHARED_AGREEMENT", word)
    assert board_module.usable_here() is on  # any processor: ordering comes from the provider's fence
