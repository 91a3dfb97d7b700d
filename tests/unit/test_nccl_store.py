"""The store control channel (agreement for the NCCL backend without MPI) with real processes
over a real torch TCPStore on localhost: the test process serves the store, three subprocess
ranks talk through it."""

from __future__ import annotations

import os
import time
import subprocess
import threading
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from denseccl.errors import CollectiveTimeoutError, CommunicatorBrokenError, DenseCCLError
from denseccl.backends.store import SoloControl, StoreControl, wait_for_keys
from tests.support.checker import expect_summaries

RANK_PROGRAM = Path(__file__).with_name("store_rank.py")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def server():
    """A real TCPStore (torch's) on localhost; the tests that need one skip without torch."""
    torch_distributed = pytest.importorskip("torch.distributed")
    store = torch_distributed.TCPStore("127.0.0.1", 0, 4, True, timeout=timedelta(seconds=60), wait_for_workers=False)
    yield store


def run_ranks(port: int, scenario: str, size: int = 3) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    processes = [
        subprocess.Popen(
            [sys.executable, str(RANK_PROGRAM), str(port), str(rank), str(size), scenario],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for rank in range(size)
    ]
    failures, outputs = [], []
    for rank, process in enumerate(processes):
        try:
            out, err = process.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            process.kill()
            out, err = process.communicate()
            failures.append(f"rank {rank} hung\n{out}\n{err}")
            continue
        outputs.append(out)
        if process.returncode != 0:
            failures.append(f"rank {rank} exited {process.returncode}\n{out}\n{err[-3000:]}")
    assert not failures, "\n".join(failures)
    expect_summaries("\n".join(outputs), "store", size)


def test_three_ranks(server):
    """150 rounds of both exchanges (keys cleaned up as they go), agreement with a mismatch and
    an invalid rank, split by color, then a rank that never joins: the others time out."""
    run_ranks(server.port, "exchanges,agreement,split,timeout")


def test_one_rank_in_process(server):
    control = StoreControl(server, 0, 1, "test/solo")
    assert control.allreduce_max([3, -4], None) == [3, -4]
    assert control.allgather_bytes(b"", None) == [b""]
    assert control.split(None, 0, None) is None
    assert control.split(5, 0, None).size == 1


def test_wait_for_keys_times_out(server):
    server.set("present", b"1")
    wait_for_keys(server, ["present"], None, "x")
    import time

    started = time.monotonic()
    with pytest.raises(CollectiveTimeoutError, match="absent"):
        wait_for_keys(server, ["present", "absent"], time.monotonic() + 0.3, "the agreement step")
    assert time.monotonic() - started < 10


def test_bad_rank():
    with pytest.raises(DenseCCLError):
        StoreControl(object(), 3, 3)


def test_solo_control():
    solo = SoloControl()
    assert solo.allreduce_max([1, 2], None) == [1, 2]
    assert solo.allgather_bytes(b"x", None) == [b"x"]
    assert solo.split(None, 0, None) is None and solo.split(0, 0, None).size == 1


def test_a_rank_that_gives_up_leaves_the_news_on_the_store(server, monkeypatch) -> None:
    """The store round carries no notes: a rank that gives up (a timeout, an interrupt) leaves a
    key that its peers read, at most every WATCH_SECONDS and never in a channel of one rank
    (whose calls make no store operation)."""
    from denseccl import config

    monkeypatch.setattr(config, "WATCH_SECONDS", 0.05)
    ranks = [StoreControl(server, rank, 3, "test/news") for rank in range(3)]
    assert [control.peer_gave_up() for control in ranks] == [None, None, None]
    ranks[1].give_up()
    deadline = time.monotonic() + 5
    while ranks[2].peer_gave_up() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ranks[2].peer_gave_up() == 1 and ranks[0].gave_up_flag()[0] in (0, 1)
    from tests.support.counting_store import CountingStore

    counted = CountingStore(server)
    alone = StoreControl(counted, 0, 1, "test/news")
    time.sleep(0.1)
    assert alone.peer_gave_up() is None and alone.gave_up_flag()[0] == 0 and counted.ops == 0


def test_a_rank_waiting_in_the_store_round_hears_that_a_peer_gave_up(server, monkeypatch) -> None:
    """Rank 1 gives up instead of joining the round: ranks 0 and 2, waiting for its key, raise
    CommunicatorBrokenError naming it (within a watch of the news), not a timeout."""
    from denseccl import config

    monkeypatch.setattr(config, "WATCH_SECONDS", 0.05)
    ranks = [StoreControl(server, rank, 3, "test/waiting") for rank in range(3)]
    outcomes: list = [None, None, None]

    def wait_in_round(rank: int) -> None:
        try:
            ranks[rank].allgather_bytes(b"x", time.monotonic() + 20)
            outcomes[rank] = "returned"
        except CommunicatorBrokenError as error:
            outcomes[rank] = str(error)
        except CollectiveTimeoutError as error:
            outcomes[rank] = f"timed out: {error}"

    threads = [threading.Thread(target=wait_in_round, args=(rank,)) for rank in (0, 2)]
    for thread in threads:
        thread.start()
    time.sleep(0.2)
    ranks[1].give_up()
    for thread in threads:
        thread.join(30)
    assert outcomes[1] is None
    for rank in (0, 2):
        assert "rank 1 gave up" in outcomes[rank], outcomes[rank]
