"""Doorbells (denseccl/channel/doorbell.py) in one process: ranks as threads over one page.
Real ranks sleep on them whenever they share cores (tests/mpi/test_pinning.py)."""

from __future__ import annotations

import ctypes
import threading
import time

import pytest

from denseccl import config
from denseccl.channel import doorbell
from denseccl.channel.doorbell import WORDS, Doorbells, futex_call

futex = futex_call()
needs_futex = pytest.mark.skipif(futex is None, reason="no futex system call known here")


def bells(size: int, monkeypatch: pytest.MonkeyPatch, nap: float) -> list:
    monkeypatch.setattr(config, "NAP_SECONDS", nap)  # read at construction
    page = (ctypes.c_int32 * (size * WORDS))()
    return [Doorbells(page, ctypes.addressof(page), rank, size, futex, lambda: None) for rank in range(size)]  # type: ignore[arg-type]


@needs_futex
def test_a_test_that_is_already_true_does_not_sleep(monkeypatch: pytest.MonkeyPatch) -> None:
    mine = bells(2, monkeypatch, nap=30.0)[0]
    started = time.monotonic()
    assert mine.doze(lambda: True) is True
    assert time.monotonic() - started < 10


@needs_futex
def test_a_sleeper_wakes_when_its_peer_rings(monkeypatch: pytest.MonkeyPatch) -> None:
    sleeper, ringer = bells(2, monkeypatch, nap=30.0)
    done = threading.Event()
    woke = []

    def sleep() -> None:
        woke.append(sleeper.doze(done.is_set))

    thread = threading.Thread(target=sleep)
    thread.start()
    time.sleep(0.2)  # the sleeper is in its futex wait by now (its nap is 30 s)
    done.set()
    ringer.ring()
    thread.join(20)
    assert not thread.is_alive() and woke == [False]  # woken by the ring, long before its nap ended


@needs_futex
def test_a_sleeper_nobody_rings_wakes_after_its_nap(monkeypatch: pytest.MonkeyPatch) -> None:
    lonely = bells(3, monkeypatch, nap=0.01)[2]
    assert lonely.doze(lambda: False) is False  # returns: every sleep is bounded


@needs_futex
def test_ring_without_sleepers_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    members = bells(3, monkeypatch, nap=0.01)
    members[0].ring()
    assert all(bytes(memoryview(m._words).cast("B")) == bytes(3 * WORDS * 4) for m in members[:1])


def test_no_futex_on_an_unknown_processor(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(doorbell.platform, "machine", lambda: "pdp11")
    assert futex_call() is None


@needs_futex
def test_two_sleepers_waiting_for_a_third_do_not_wake_each_other(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ranks that both wait for a slow third one sleep out their naps: a doze that rang its
    peers woke the other sleeper, which rang back, and so on (a core kept busy for nothing)."""
    members = bells(3, monkeypatch, nap=0.2)
    dozes = [0, 0]
    stop = time.monotonic() + 0.5

    def wait(rank: int) -> None:
        while time.monotonic() < stop:
            members[rank].doze(lambda: False)
            dozes[rank] += 1

    threads = [threading.Thread(target=wait, args=(rank,)) for rank in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert all(count <= 6 for count in dozes), dozes  # about 3 naps of 0.2 s each in 0.5 s
