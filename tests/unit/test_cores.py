"""Which cores a host's ranks may use (denseccl/channel/cores.py) and the wait policy it sets
(wait.py ``Waiting``), in one process. Real ranks under taskset and in a cgroup:
tests/mpi/test_pinning.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from denseccl import config
from denseccl.errors import DenseCCLError
from denseccl.channel import cores
from denseccl.wait import Waiting
from denseccl.channel.cores import Placement


@pytest.mark.parametrize(
    "masks, own",
    [
        ([{0}, {1}], True),
        ([{0}, {0}], False),
        ([{0, 1}, {0}], True),  # the first rank moves to core 1
        ([{0}, {0}, {1, 2}], False),  # three cores in the union, but two ranks want core 0 alone
        ([{0, 1}, {0, 1}, {0, 1}], False),
        ([{0, 1}, {1, 2}, {0, 2}], True),
        ([{0, 1}, {0}, {1}], False),  # needs the augmenting path to see it
        ([set(range(64))] * 64, True),
        ([], True),
    ],
)
def test_own_cores_is_a_matching_of_ranks_to_cores(masks: list, own: bool) -> None:
    assert cores.own_cores(masks) is own


def placement(cpus: set, cgroup: str = None, limit: float = None) -> Placement:  # type: ignore[assignment]
    return Placement(frozenset(cpus), cgroup, limit)


def test_judge_combines_masks_and_quotas() -> None:
    free = [placement({0, 1, 2, 3}), placement({0, 1, 2, 3})]
    assert cores.judge(free) is False
    assert cores.judge([placement({0}), placement({0})]) is True
    one_core_quota = [placement({0, 1, 2, 3}, "/cg/job", 1.0), placement({0, 1, 2, 3}, "/cg/job", 1.0)]
    assert cores.judge(one_core_quota) is True
    assert cores.judge([placement({0, 1}, "/cg/job", 2.0)] * 2) is False  # exactly a core each
    assert cores.judge([placement({0, 1}, "/cg/job", 1.5)] * 2) is True  # throttled before the period ends
    separate = [placement({0, 1}, "/cg/a", 1.0), placement({0, 1}, "/cg/b", 1.0)]  # a quota each
    assert cores.judge(separate) is False


def write(root: Path, files: dict) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def mountinfo(*mounts: tuple) -> str:
    """mountinfo lines for ``(root, mount point, fstype, super options)``."""
    return "".join(
        f"{30 + i} 1 0:{40 + i} {root} {point} rw,relatime - {fstype} {fstype} {options}\n"
        for i, (root, point, fstype, options) in enumerate(mounts)
    )


def test_cgroup_v2_takes_the_tightest_limit_of_the_cgroup_and_its_parents(tmp_path: Path) -> None:
    fs = tmp_path / "cgroup2"
    write(
        fs,
        {"job/cpu.max": "300000 100000\n", "job/step/cpu.max": "max 100000\n", "job/step/rank/cpu.max": "max 100000\n"},
    )
    proc = write(
        tmp_path / "proc", {"cgroup": "0::/job/step/rank\n", "mountinfo": mountinfo(("/", str(fs), "cgroup2", "rw"))}
    )
    where, limit = cores.cgroup_limit(str(proc))
    assert limit == 3.0 and where == str(fs / "job")
    write(fs, {"job/step/cpu.max": "150000 100000\n"})
    assert cores.cgroup_limit(str(proc)) == (str(fs / "job/step"), 1.5)


def test_cgroup_v2_without_a_limit(tmp_path: Path) -> None:
    fs = write(tmp_path / "cgroup2", {"cpu.max": "max 100000\n"})
    proc = write(tmp_path / "proc", {"cgroup": "0::/\n", "mountinfo": mountinfo(("/", str(fs), "cgroup2", "rw"))})
    assert cores.cgroup_limit(str(proc)) == (None, None)


def test_cgroup_v1_beside_v2_and_a_container_mount_root(tmp_path: Path) -> None:
    cpu = tmp_path / "cpu"
    write(
        cpu,
        {
            "cpu.cfs_quota_us": "-1\n",
            "cpu.cfs_period_us": "100000\n",
            "inner/cpu.cfs_quota_us": "50000\n",
            "inner/cpu.cfs_period_us": "100000\n",
        },
    )
    unified = write(tmp_path / "unified", {})
    proc = write(
        tmp_path / "proc",
        {
            "cgroup": "9:name=systemd:/\n4:memory:/x\n1:cpu,cpuacct:/docker/abc/inner\n0::/\n",
            # the container sees its own cgroup /docker/abc as the mount's root
            "mountinfo": mountinfo(
                ("/", str(unified), "cgroup2", "rw"), ("/docker/abc", str(cpu), "cgroup", "rw,cpu,cpuacct")
            ),
        },
    )
    assert cores.cgroup_limit(str(proc)) == (str(cpu / "inner"), 0.5)


def test_unreadable_cgroup_files_mean_no_limit(tmp_path: Path) -> None:
    assert cores.cgroup_limit(str(tmp_path / "nowhere")) == (None, None)
    proc = write(tmp_path / "proc", {"cgroup": "garbage\n", "mountinfo": "also garbage\n"})
    assert cores.cgroup_limit(str(proc)) == (None, None)
    fs = write(tmp_path / "fs", {"cpu.max": "lots 100000\n"})
    proc = write(tmp_path / "proc2", {"cgroup": "0::/\n", "mountinfo": mountinfo(("/", str(fs), "cgroup2", "rw"))})
    assert cores.cgroup_limit(str(proc)) == (None, None)


def test_local_placement_is_this_process_mask() -> None:
    import os

    here = cores.local_placement()
    assert here.cpus == frozenset(os.sched_getaffinity(0))
    assert 1 <= cores.usable_cores(here) <= len(here.cpus)
    assert cores.usable_cores(placement({0, 1, 2, 3}, "/cg", 1.5)) == 2


def test_waiting_yields_at_once_when_crowded_and_stays_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DENSECCL_WAIT", raising=False)
    waiting = Waiting()
    assert waiting.spins(64) == 64
    waiting.note(False)
    assert waiting.spins(64) == 64
    waiting.note(True)
    assert waiting.spins(64) == 0
    waiting.note(False)  # a sub-communicator's ranks still compete with the rest of the host
    assert waiting.crowded is True


@pytest.mark.parametrize(
    "word, detected, crowded",
    [("spin", True, False), ("yield", False, True), ("auto", True, True), ("AUTO", False, False)],
)
def test_the_wait_setting(monkeypatch: pytest.MonkeyPatch, word: str, detected: bool, crowded: bool) -> None:
    monkeypatch.setenv("DENSECCL_WAIT", word)
    waiting = Waiting()
    waiting.note(detected)
    assert waiting.crowded is crowded


def test_a_bad_wait_setting_names_the_choices() -> None:
    with pytest.raises(DenseCCLError, match="DENSECCL_WAIT must be one of auto, spin, yield"):
        config.settings({"DENSECCL_WAIT": "sometimes"})
