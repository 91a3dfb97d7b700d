"""How many cores the ranks of one host may use, and whether each rank can have one of its own.

Why: a rank that polls for a peer (``wait.wait_until``, the board's reads) wins latency only
while the peer runs on another core; on the same core every poll keeps the peer off it until the
time slice ends, and a 4 KiB allreduce takes milliseconds. ``os.cpu_count()`` counts the
machine's cores, not the ones a rank may use. What can tell:

- the affinity mask (``taskset``, Slurm's ``--cpu-bind``, cpusets, ``--cpuset-cpus``): ranks
  can each have a core only if their masks admit a matching of ranks to distinct cores
  (``{0}, {0}, {1, 2}`` cannot, though their union has three cores);
- the cgroup CPU quota (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``; ``docker --cpus``, Kubernetes
  limits): ranks polling past it are throttled for the rest of the period, whatever their masks.

:func:`judge` decides from every rank's :class:`Placement`, gathered once at bootstrap by whoever
sets up the channel (hosts.py), over whichever round the launch has.
"""

from __future__ import annotations

import math
import os
from typing import Dict, FrozenSet, Iterable, List, NamedTuple, Optional, Sequence, Tuple

class Placement(NamedTuple):
    """What one rank may use: its affinity mask, and its cgroup with that cgroup's CPU limit."""

    cpus: FrozenSet[int]
    #: the cgroup that holds the limit (ranks in one cgroup share it); None without a limit
    cgroup: Optional[str]
    #: the limit in cores (quota / period); None without one
    limit: Optional[float]


def local_placement(proc: str = "/proc/self") -> Placement:
    """This process's :class:`Placement` (``proc``: its /proc directory)."""
    try:
        cpus = frozenset(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no affinity masks on this system: every core
        cpus = frozenset(range(os.cpu_count() or 1))
    cgroup, limit = cgroup_limit(proc)
    return Placement(cpus, cgroup, limit)


def cgroup_limit(proc: str = "/proc/self") -> Tuple[Optional[str], Optional[float]]:
    """The tightest CPU quota on this process's cgroup and its ancestors: ``(the cgroup
    directory that sets it, cores)``, or ``(None, None)`` where none is set or readable.
    ``proc/cgroup`` names the cgroups, ``proc/mountinfo`` where their hierarchies are mounted
    (cgroup v2, v1, or both side by side)."""
    cgroups, mounts = _read(os.path.join(proc, "cgroup")), _read(os.path.join(proc, "mountinfo"))
    if cgroups is None or mounts is None:
        return None, None
    best: Tuple[Optional[str], Optional[float]] = (None, None)
    for line in cgroups.splitlines():
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if controllers == "":  # cgroup v2: the unified hierarchy
            where, read = _mount(mounts, "cgroup2", None), _v2_limit
        elif "cpu" in controllers.split(","):  # cgroup v1: the hierarchy with the cpu controller
            where, read = _mount(mounts, "cgroup", "cpu"), _v1_limit
        else:
            continue
        if where is None:
            continue
        mount_root, mount_point = where
        relative = path if mount_root == "/" else path[len(mount_root):] if path.startswith(mount_root) else path
        for directory in _ancestors(relative):
            limit = read(os.path.join(mount_point, directory))
            if limit is not None and (best[1] is None or limit < best[1]):
                best = (os.path.normpath(os.path.join(mount_point, directory)), limit)
    return best


def _mount(mountinfo: str, fstype: str, controller: Optional[str]) -> Optional[Tuple[str, str]]:
    """``(root of the hierarchy inside the mount, mount point)`` of the first mount of
    ``fstype`` (carrying ``controller`` among its super options, for v1)."""
    for line in mountinfo.splitlines():
        head, _, tail = line.partition(" - ")
        fields, rest = head.split(), tail.split()
        if len(fields) < 5 or len(rest) < 3 or rest[0] != fstype:
            continue
        if controller is not None and controller not in rest[2].split(","):
            continue
        return fields[3], fields[4]
    return None


def _ancestors(path: str) -> List[str]:
    """``/a/b`` -> ``["a/b", "a", ""]``: a cgroup's directory and its parents', relative to
    the mount (a limit on a parent bounds its children)."""
    parts = [p for p in path.strip().split("/") if p and p != ".."]
    return ["/".join(parts[:n]) for n in range(len(parts), -1, -1)]


def _read(path: str) -> Optional[str]:
    try:
        with open(path) as handle:
            return handle.read().strip()
    except OSError:
        return None


def _v2_limit(directory: str) -> Optional[float]:
    """``cpu.max`` holds ``"$QUOTA $PERIOD"`` (microseconds), or ``"max $PERIOD"``: no limit."""
    words = (_read(os.path.join(directory, "cpu.max")) or "").split()
    return _cores(words[0], words[1]) if len(words) >= 2 else None


def _v1_limit(directory: str) -> Optional[float]:
    """``cpu.cfs_quota_us`` is -1 when unlimited."""
    quota, period = (_read(os.path.join(directory, f"cpu.cfs_{name}_us")) for name in ("quota", "period"))
    return _cores(quota, period)


def _cores(quota: Optional[str], period: Optional[str]) -> Optional[float]:
    """``quota / period`` in cores; None where either is missing, not a number (``max``) or not positive."""
    try:
        q, p = int(quota), int(period)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return q / p if q > 0 and p > 0 else None


def own_cores(masks: Sequence[Iterable[int]]) -> bool:
    """Whether every rank can run on a core of its own mask, no two on one core: a matching
    of ranks to cores that covers every rank (augmenting paths; ranks and cores of one host
    are few)."""
    masks = [sorted(set(mask)) for mask in masks]
    holder: Dict[int, int] = {}  # core -> the rank matched to it

    def place(rank: int, tried: set) -> bool:
        for core in masks[rank]:
            if core in tried:
                continue
            tried.add(core)
            if core not in holder or place(holder[core], tried):
                holder[core] = rank
                return True
        return False

    return all(place(rank, set()) for rank in range(len(masks)))


def judge(placements: Sequence[Placement]) -> bool:
    """Crowded: the host's ranks (``placements``, one per rank) cannot each have a core of
    their own, by their affinity masks or by their cgroups' CPU limits."""
    if not own_cores([p.cpus for p in placements]):
        return True
    ranks_per_cgroup: Dict[str, int] = {}
    limits: Dict[str, float] = {}
    for placement in placements:
        if placement.cgroup is not None and placement.limit is not None:
            ranks_per_cgroup[placement.cgroup] = ranks_per_cgroup.get(placement.cgroup, 0) + 1
            limits[placement.cgroup] = placement.limit
    return any(ranks > limits[cgroup] + 1e-9 for cgroup, ranks in ranks_per_cgroup.items())


def usable_cores(placement: Optional[Placement] = None) -> int:
    """The cores this process may use (mask and quota), for messages and the benchmark."""
    placement = placement or local_placement()
    cores = len(placement.cpus)
    if placement.limit is not None:
        cores = min(cores, max(1, math.ceil(placement.limit)))
    return cores
