"""The board without MPI, in one process (denseccl/channel/: segment.py, fence.py, hosts.py,
control.py): ranks as threads that meet over an in-process channel. Real ranks under torchrun
and mp.spawn use it in tests/torch/test_torch_board.py."""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any, Dict, List, Optional, Sequence

import pytest

from denseccl.channel.base import ControlChannel
from denseccl.channel import fence, hosts, segment
from denseccl.channel.base import DIFFERENT, MIXED_TAGS, SAME
from denseccl.channel.board import page_bytes
from denseccl.channel.shared import SharedControl, open_shared
from denseccl.errors import CommunicatorBrokenError
from denseccl.wait import WAITING

needs_shm = pytest.mark.skipif(not segment.available(), reason="no memfd_create or socket.send_fds here")


@pytest.fixture(autouse=True)
def waiting_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Threads sharing a board may judge this process crowded (wait.WAITING): undone after each test."""
    monkeypatch.setattr(WAITING, "crowded", WAITING.crowded)
    monkeypatch.setattr(WAITING, "doorbells", WAITING.doorbells)
    monkeypatch.setattr(WAITING, "_live", list(WAITING._live))


def mine() -> set:
    """This process's memfd segments now (their descriptors and mappings), and anything of
    denseccl's in /dev/shm (never: segments have no name)."""
    shm = os.listdir("/dev/shm") if os.path.isdir("/dev/shm") else []
    with open("/proc/self/maps") as maps:
        mapped = {line.split()[0] for line in maps if "/memfd:denseccl" in line}
    return {name for name in shm if name.startswith(segment.PREFIX)} | mapped


class Meeting:
    """What the threads of one test share: an allgather by barrier."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.slots: List[Any] = [None] * size
        self.barrier = threading.Barrier(size)


class ThreadChannel(ControlChannel):
    """A control channel between threads (allgather_bytes only, which is all the setup uses)."""

    def __init__(self, meeting: Meeting, rank: int) -> None:
        self.meeting, self.rank, self.size = meeting, rank, meeting.size
        self.exchanges = 0

    def allgather_bytes(self, data: bytes, deadline: Optional[float]) -> Sequence[bytes]:
        self.exchanges += 1
        self.meeting.barrier.wait(30)
        self.meeting.slots[self.rank] = bytes(data)
        self.meeting.barrier.wait(30)
        every = list(self.meeting.slots)
        self.meeting.barrier.wait(30)
        return every

    def allreduce_max(self, values: Sequence[int], deadline: Optional[float]) -> Sequence[int]:
        rows = [json.loads(raw) for raw in self.allgather_bytes(json.dumps(list(values)).encode(), deadline)]
        return [max(column) for column in zip(*rows)]


def together(size: int, work: Any) -> List[Any]:
    meeting = Meeting(size)
    results: List[Any] = [None] * size
    errors: List[BaseException] = []

    def rank_thread(rank: int) -> None:
        try:
            results[rank] = work(ThreadChannel(meeting, rank))
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)
            meeting.barrier.abort()

    threads = [threading.Thread(target=rank_thread, args=(rank,)) for rank in range(size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    if errors:
        raise errors[0]
    return results


@needs_shm
def test_a_segment_is_handed_over_with_no_name_anywhere() -> None:
    """The creator's memfd reaches a peer over the abstract socket: one memory, zeroed, nothing
    in /dev/shm; a receiver refuses a descriptor of another size; a name that is not a
    segment's is refused; a closed hand-over ends a waiting peer's receive with OSError."""
    before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    descriptor = segment.Segment.make(8192)
    handout = segment.Handout(descriptor, 2)
    try:
        assert len(handout.name) == len(segment.PREFIX) + 32
        first, second = segment.connect(handout.name), segment.connect(handout.name)
        handout.give(2, time.monotonic() + 10)
        made = segment.Segment.map_descriptor(descriptor, 8192)
        other = segment.receive(first, 8192, time.monotonic() + 10)
        with pytest.raises(OSError, match="not the segment announced"):
            segment.receive(second, 4096, time.monotonic() + 10)
        late = segment.connect(handout.name)
    finally:
        handout.close()
    with pytest.raises(OSError):
        segment.receive(late, 8192, time.monotonic() + 10)
    assert bytes(made.map[:8192]) == bytes(8192)  # zeroed
    made.map[0] = 7
    assert other.map[0] == 7  # one memory
    if os.path.isdir("/dev/shm"):
        assert set(os.listdir("/dev/shm")) <= before  # no name: nothing to leave behind
    view = other.view(0, 8)
    other.close()  # a view is left: the mapping stays until it goes
    assert view[0] == 7
    view.release()
    made.close()
    with pytest.raises(OSError, match="not a denseccl segment"):
        segment.connect("../etc/passwd")


@needs_shm
def test_a_segment_reserves_its_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    """posix_fallocate runs when a segment is made (no room is an OSError then, not SIGBUS at
    the first write); its failure closes the descriptor."""
    sizes: List[int] = []
    real = os.posix_fallocate

    def fallocate(descriptor: int, offset: int, length: int) -> None:
        sizes.append(length)
        real(descriptor, offset, length)

    monkeypatch.setattr(os, "posix_fallocate", fallocate)
    os.close(segment.Segment.make(12288))
    assert sizes == [12288]

    def full(descriptor: int, offset: int, length: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    open_before = len(os.listdir("/proc/self/fd"))
    with pytest.raises(OSError, match="No space"):
        segment.Segment.make(4096)
    assert len(os.listdir("/proc/self/fd")) == open_before


def test_the_fence_is_refused_where_it_would_be_wrong(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the compiled fence, only x86-TSO gets a board; an ARM host falls back."""
    assert fence.page_fence() is not None  # this machine: compiled, or x86
    import denseccl

    monkeypatch.setitem(__import__("sys").modules, "denseccl._fence", None)  # as if never built
    assert fence.page_fence("aarch64") is None
    assert fence.page_fence("ppc64le") is None
    assert fence.page_fence("x86_64") is not None
    assert denseccl is not None


def entry(host: str, where: str, cpus: Sequence[int], board: bool = True, limit: Optional[float] = None) -> Dict:
    return {"host": host, "where": where, "cpus": list(cpus), "cgroup": "/cg" if limit else None, "limit": limit,
            "board": board, "futex": True}


def test_hosts_are_told_apart_by_name_boot_and_shm() -> None:
    entries = [
        entry("a", "boot1/5:1", [0]), entry("a", "boot1/5:1", [1]),
        entry("a", "boot1/6:1", [0]),  # same name, another /dev/shm (a container): another host
        entry("b", "boot2/5:1", [0, 1]), entry("a", "boot1/5:1", [2]),
    ]
    layout = hosts.plan(entries, 4)
    assert layout.hosts == ((0, 1, 4), (2,), (3,))
    assert layout.ranks == (0, 1, 4) and layout.leaders == (0, 2, 3)
    assert layout.usable and layout.crowded == (False, False, False)
    crowded = hosts.plan([entry("a", "x", [0]), entry("a", "x", [0])], 0)
    assert crowded.crowded == (True,)
    quota = hosts.plan([entry("a", "x", [0, 1], limit=1.0), entry("a", "x", [0, 1], limit=1.0)], 1)
    assert quota.crowded == (True,)
    assert not hosts.plan([entry("a", "x", [0]), entry("a", "x", [1], board=False)], 0).usable
    alone = hosts.plan([entry("a", "", [0]), entry("a", "", [1])], 0)  # no network namespace to tell: nothing shared
    assert alone.hosts == ((0,), (1,))


@needs_shm
@pytest.mark.parametrize("size", [2, 4])
def test_threads_meet_on_one_board_and_leave_nothing(size: int) -> None:
    before = mine()

    def work(channel: ThreadChannel) -> Any:
        control = open_shared(channel, time.monotonic() + 30)
        assert isinstance(control, SharedControl) and control.board is not None
        answers = [control.all_equal(11, False, time.monotonic() + 30) for _ in range(50)]
        answers.append(control.all_equal(11 + (channel.rank == size - 1), False, time.monotonic() + 30))
        answers.append(control.all_equal(3, channel.rank == 0, time.monotonic() + 30))
        control.close()
        return answers, channel.exchanges

    for answers, exchanges in together(size, work):
        assert answers == [SAME] * 50 + [DIFFERENT, DIFFERENT]
        assert exchanges == 4  # who we are, the segment's socket, everyone connected, everyone mapped
    assert mine() == before  # closed: unmapped, nothing named anywhere


@needs_shm
@pytest.mark.parametrize("fault", ["make", "receive"])
def test_a_failed_segment_is_no_board_on_every_rank_at_once(monkeypatch: pytest.MonkeyPatch, fault: str) -> None:
    """The first rank cannot make the segment (no memory), or one peer cannot map what it was
    handed: every rank falls back to the round, none waits for the deadline, nothing stays
    mapped."""
    before = mine()
    if fault == "make":
        def full(descriptor: int, offset: int, length: int) -> None:
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(os, "posix_fallocate", full)
    else:
        real = segment.receive
        calls: List[int] = []

        def receive(*args: Any) -> Any:
            calls.append(1)
            if len(calls) == 2:  # the second receiver to map fails
                args[0].close()
                raise OSError("mmap failed")
            return real(*args)

        monkeypatch.setattr(segment, "receive", receive)
    started = time.monotonic()
    controls = together(3, lambda channel: open_shared(channel, time.monotonic() + 30))
    assert all(isinstance(control, ThreadChannel) for control in controls)
    assert time.monotonic() - started < 10
    assert mine() == before


@needs_shm
def test_no_board_anywhere_when_one_rank_turns_it_off(monkeypatch: pytest.MonkeyPatch) -> None:
    real = hosts.about_me
    asked: List[int] = []

    def about() -> Dict:
        found = real()
        asked.append(1)
        found["board"] = len(asked) != 2  # the second thread to ask says no
        return found

    monkeypatch.setattr(hosts, "about_me", about)
    controls = together(3, lambda channel: open_shared(channel, time.monotonic() + 30))
    assert all(isinstance(control, ThreadChannel) for control in controls)


@needs_shm
def test_a_rank_that_gives_up_breaks_its_peers_wait() -> None:
    def work(channel: ThreadChannel) -> Any:
        control = open_shared(channel, time.monotonic() + 30)
        assert control.all_equal(1, False, time.monotonic() + 30) == SAME
        channel.meeting.barrier.wait(30)  # both have read call 1
        if channel.rank == 0:
            control.give_up()
            return "gave up"
        started = time.monotonic()
        try:
            control.all_equal(2, False, time.monotonic() + 60)
        except CommunicatorBrokenError as error:
            return f"broken after {time.monotonic() - started:.1f}s: {error}"
        return "agreed"

    gave, waited = together(2, work)
    assert gave == "gave up" and waited.startswith("broken") and "rank 0 gave up" in waited


@needs_shm
def test_crowded_threads_get_doorbells(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hosts, "local_placement", lambda: hosts.Placement(frozenset({0}), None, None))
    WAITING.crowded, WAITING.doorbells = False, None

    def work(channel: ThreadChannel) -> Any:
        control = open_shared(channel, time.monotonic() + 30)
        return control.board.crowded, [control.all_equal(4, False, time.monotonic() + 30) for _ in range(20)]

    for crowded, answers in together(2, work):
        assert crowded and answers == [SAME] * 20
    assert WAITING.crowded and WAITING.doorbells is not None and WAITING.doorbells.size == 2


def test_the_page_holds_the_board_then_the_doorbells() -> None:
    assert page_bytes(2) == 5 * 64


def test_the_environment_report_names_the_agreement_path(monkeypatch: pytest.MonkeyPatch) -> None:
    from denseccl import envreport

    paths = envreport.agreement_paths()
    assert set(paths) == {"mpiexec, srun", "torchrun, spawn, store"}
    if segment.available():
        assert "no store operation per call" in paths["torchrun, spawn, store"]
        assert "barriers) of up to 65536 bytes move through the board's segment" in paths["torchrun, spawn, store"]
        monkeypatch.setenv("DENSECCL_HOST_PATH", "0")
        assert "DENSECCL_HOST_PATH=0: every gloo engine call through gloo" in envreport.agreement_paths()[
            "torchrun, spawn, store"
        ]
        monkeypatch.delenv("DENSECCL_HOST_PATH")
    assert "The agreement step" in envreport.report()
    monkeypatch.setattr(fence, "page_fence", lambda machine=None: None)  # an ARM host without the fence
    assert envreport.agreement_paths()["torchrun, spawn, store"].startswith("no board")
    monkeypatch.setenv("DENSECCL_SHARED_AGREEMENT", "off")
    assert all("is off" in text for text in envreport.agreement_paths().values())


@needs_shm
def test_across_hosts_each_host_agrees_then_its_leader(monkeypatch: pytest.MonkeyPatch) -> None:
    """Four threads as two hosts of two (told apart by their /dev/shm identity): a board per
    host, then the leaders (ranks 0 and 2) over a channel of their own, then the leader's
    answer on its board. Every rank gets the same answer: all agree; one rank differs on
    host 0; on host 1; the hosts differ though each agrees within; one rank invalid."""
    real = hosts.about_me
    where = threading.local()

    def about() -> Dict:
        found = real()
        found["where"] += f"/host{where.host}"  # as containers with a /dev/shm of their own
        return found

    monkeypatch.setattr(hosts, "about_me", about)
    leaders_meeting = Meeting(2)

    def make_leaders(inner: ControlChannel, leader: bool, deadline: Optional[float]) -> Optional[ControlChannel]:
        return ThreadChannel(leaders_meeting, inner.rank // 2) if leader else None

    cases = [  # per rank (value, invalid) -> answer
        ([(5, False)] * 4, SAME),
        ([(5, False), (6, False), (5, False), (5, False)], DIFFERENT),
        ([(5, False), (5, False), (5, False), (6, False)], DIFFERENT),
        ([(5, False), (5, False), (7, False), (7, False)], DIFFERENT),
        ([(5, False), (5, False), (5, True), (5, False)], DIFFERENT),
        ([(9, False)] * 4, SAME),
        # with tags (prepared calls): equal, one host mixed, each host agreeing but the hosts not, both mixed
        ([(4, False, 1)] * 4, SAME),
        ([(4, False, 1), (4, False, 1), (4, False, 1), (4, False, 0)], MIXED_TAGS),
        ([(4, False, 1), (4, False, 1), (4, False, 2), (4, False, 2)], MIXED_TAGS),
        ([(4, False, 0), (4, False, 1), (4, False, 1), (4, False, 0)], MIXED_TAGS),
        ([(4, False, 0), (4, False, 1), (4, True, 1), (4, False, 0)], DIFFERENT),
    ]

    def work(channel: ThreadChannel) -> Any:
        where.host = channel.rank // 2
        control = open_shared(channel, time.monotonic() + 30, make_leaders)
        assert isinstance(control, SharedControl) and len(control.layout.hosts) == 2
        assert (control.leaders is not None) == (channel.rank % 2 == 0) and control.board is not None
        deadline = time.monotonic() + 30
        answers = [control.all_equal(*case[channel.rank][:2], deadline, *case[channel.rank][2:]) for case, _ in cases]
        control.board.close()
        return answers

    for answers in together(4, work):
        assert answers == [answer for _, answer in cases]


@needs_shm
def test_a_leader_that_gives_up_tells_the_other_hosts_leaders(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two hosts of two; the leaders meet over a store channel (as the NCCL path's leaders may).
    Host 0's leader gives up instead of calling: host 1's leader, waiting for it in the leaders'
    round, hears it there (not at the deadline); its own give-up then ends its host peer's wait."""
    torch_distributed = pytest.importorskip("torch.distributed")
    from datetime import timedelta

    from denseccl import config
    from denseccl.backends.store import StoreControl

    monkeypatch.setattr(config, "WATCH_SECONDS", 0.05)
    server = torch_distributed.TCPStore("127.0.0.1", 0, 1, True, timeout=timedelta(seconds=30), wait_for_workers=False)
    real = hosts.about_me
    where = threading.local()

    def about() -> Dict:
        found = real()
        found["where"] += f"/host{where.host}"
        return found

    monkeypatch.setattr(hosts, "about_me", about)

    def make_leaders(inner: ControlChannel, leader: bool, deadline: Optional[float]) -> Optional[ControlChannel]:
        return StoreControl(server, inner.rank // 2, 2, "test/leaders") if leader else None

    def work(channel: ThreadChannel) -> Any:
        where.host = channel.rank // 2
        control = open_shared(channel, time.monotonic() + 30, make_leaders)
        assert control.all_equal(3, False, time.monotonic() + 30) == SAME
        channel.meeting.barrier.wait(30)
        try:
            if channel.rank == 0:
                control.give_up()
                return "gave up"
            if channel.rank == 1:
                return "stayed away"
            try:
                control.all_equal(4, False, time.monotonic() + 20)
            except CommunicatorBrokenError as error:
                control.give_up()  # what the engine does with a failure that breaks
                return f"broken: {error}"
            return "agreed"
        finally:
            if control.board is not None:
                control.board.close()

    outcomes = together(4, work)
    assert outcomes[:2] == ["gave up", "stayed away"]
    assert "rank 0 gave up" in outcomes[2], outcomes[2]
    assert "rank 2 gave up" in outcomes[3], outcomes[3]
