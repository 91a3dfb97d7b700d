"""The MPI library's shared memory that the suite's jobs leave in /dev/shm, and its removal.

MPICH names a job's shared-memory segments ``/dev/shm/mpich_shm_<world>_<node>`` (and
``mpich_vci_<world>_<node>``); the first rank of a node creates them and unlinks them in
``MPI_Finalize``, so a job whose ranks are killed, abort or leave through ``os._exit`` leaves
them behind. ``<world>`` is, in hex, the 32-bit FNV-1a hash of the job's PMI key-value space
name, which hydra's mpiexec makes at its start as ``kvs_<its pid>_0_<rand()>_<host name>``,
with ``rand()`` seeded by ``time(NULL)``; a singleton (a rank started without a launcher, e.g. by
torchrun) uses its own pid. So the names a job can have follow from what its runner knows: the
launcher's pid, this host's name, the seconds the job ran and the pids of its processes.
Concurrent jobs (other tests, other users) have other launcher pids, hence other names.

:class:`Job` watches one launcher started in a session of its own and, when it has ended,
removes the segments with its job's names that no live process maps (``/proc/*/maps``); every
job the suite starts is recorded in :data:`JOBS`, so that the end of the session can check that
none of their segments is left (tests/conftest.py).

Not every MPI process of a run is a Job's: the test process itself becomes an MPI singleton as
soon as a test module imports ``mpi4py.MPI`` (at collection, in the run's first minutes), and a
test may start a program that imports it with a plain ``subprocess.run``. :class:`Descendants`
records, while the run lasts, every process the test process starts (directly or not) with its
command, so that the end of the session finds a singleton's segment that any of them left, and
says which command made it.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Set

SHM = Path("/dev/shm")
#: MPICH's segment names: kind, world id (hex), node id
SEGMENT = re.compile(r"^mpich_(?:shm|vci)_([0-9a-f]+)_\d+$")
#: how often the job's processes are listed (a singleton's segment is named by its pid)
SAMPLE_SECONDS = 0.5
#: how long the removal waits for the job's last processes to unmap what they mapped
SETTLE_SECONDS = 10.0

#: every job started through this module in this process, oldest first
JOBS: List["Job"] = []


def first_rand(seed: int) -> int:
    """glibc's first ``rand()`` after ``srand(seed)``: its default additive generator, seeded by
    a Lehmer generator in 32-bit C arithmetic."""
    word = (seed & 0xFFFFFFFF or 1) - ((seed & 0x80000000) << 1)  # as int32_t
    r = [word]
    for _ in range(30):
        hi = word // 127773 if word >= 0 else -(-word // 127773)  # C division truncates
        lo = word - hi * 127773
        word = 16807 * lo - 2836 * hi
        word += 2147483647 if word < 0 else 0
        r.append(word)
    r += r[:3]
    for i in range(34, 345):
        r.append((r[i - 31] + r[i - 3]) & 0xFFFFFFFF)
    return r[344] >> 1


def fnv1a(text: str) -> int:
    """The 32-bit FNV-1a hash MPICH takes of the key-value space name."""
    value = 2166136261
    for byte in text.encode():
        value = (value ^ byte) * 16777619 & 0xFFFFFFFF
    return value


def hydra_worlds(launcher: int, first: float, last: float, host: Optional[str] = None) -> Set[str]:
    """The world ids hydra's mpiexec with pid ``launcher`` gives a job it starts between the
    times ``first`` and ``last`` (seconds since the epoch)."""
    host = host or socket.gethostname()
    seeds = range(int(first) - 1, int(last) + 2)
    return {format(fnv1a(f"kvs_{launcher}_0_{first_rand(seed)}_{host}"), "x") for seed in seeds}


def is_mpi_segment(name: str) -> bool:
    """Whether a /dev/shm entry is the MPI library's own (MPICH's, Open MPI's btl/sm and
    vader), not denseccl's."""
    return name.startswith(("mpich_", "sm_segment.", "vader_segment."))


def mapped_segments(pid: str = "[0-9]*") -> Set[str]:
    """The /dev/shm files that live processes (``pid``: one, "self" or a glob) map now, by name."""
    names: Set[str] = set()
    for maps in Path("/proc").glob(f"{pid}/maps"):
        try:
            text = maps.read_text()
        except OSError:  # the process ended, or is not ours to read
            continue
        for line in text.splitlines():
            at = line.find(" /dev/shm/")
            if at >= 0:
                names.add(line[at + len(" /dev/shm/") :].split(" (deleted)")[0])
    return names


def session_pids(session: int) -> Set[int]:
    """The processes of ``session`` now."""
    pids = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getsid(int(entry)) == session:
                    pids.add(int(entry))
            except (ProcessLookupError, PermissionError):
                pass
    return pids


def kill_session(session: int) -> None:
    """SIGKILL every process of ``session`` (a job started with ``start_new_session``): MPICH's
    launcher gives each rank a process group of its own, so killing the launcher's group
    leaves the ranks running."""
    for pid in session_pids(session):
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


class Job:
    """One launcher (mpiexec, torchrun, python) started in a new session, from its start to
    :meth:`finish`: records the pids of its processes while it runs, then removes what its
    ranks left in /dev/shm."""

    def __init__(self, command: Sequence[str], **popen: object) -> None:
        self.began = time.time()
        self.process = subprocess.Popen(list(command), start_new_session=True, **popen)  # type: ignore[call-overload]
        self.ended: Optional[float] = None
        self.pids: Set[int] = {self.process.pid}
        #: the segments :meth:`finish` removed, by name
        self.removed: Set[str] = set()
        self._worlds: Optional[Set[str]] = None  # once the job has ended
        JOBS.append(self)
        self._done = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()

    def _sample(self) -> None:
        while not self._done.wait(SAMPLE_SECONDS):
            self.pids |= session_pids(self.process.pid)

    def worlds(self) -> Set[str]:
        """Every world id this job's segments can have."""
        if self._worlds is not None:
            return self._worlds
        worlds = hydra_worlds(self.process.pid, self.began, self.ended or time.time())
        worlds |= {format(pid, "x") for pid in self.pids}
        if self.ended is not None:
            self._worlds = worlds
        return worlds

    def segments(self) -> Set[str]:
        """This job's segments in /dev/shm now, by name."""
        worlds = self.worlds()
        return {name for name in _names() if (match := SEGMENT.match(name)) and match.group(1) in worlds}

    def finish(self, settle: float = SETTLE_SECONDS) -> Set[str]:
        """After the launcher has ended: kill what is left of its session, then remove the
        job's segments once no live process maps them (waiting at most ``settle`` seconds);
        the names removed. A segment some other process still maps stays."""
        if self.ended is None:
            self.pids |= session_pids(self.process.pid)
            self._done.set()
            self.ended = time.time()
        kill_session(self.process.pid)
        return self.remove(settle)

    def remove(self, settle: float = SETTLE_SECONDS) -> Set[str]:
        """Remove this job's segments that no live process maps (again, later, if some still
        were); the names removed now."""
        removed: Set[str] = set()
        deadline = time.monotonic() + settle
        while True:
            left = self.segments()
            free = left - mapped_segments()
            for name in free:
                try:
                    (SHM / name).unlink()
                    removed.add(name)
                except FileNotFoundError:
                    pass
            if left <= free or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        self.removed |= removed
        return removed


class Descendants:
    """The processes descended from this one until :meth:`stop`: pid -> command line. Children
    started with ``subprocess.Popen`` are recorded as they start (``Popen.__init__`` is wrapped:
    a short-lived one would escape any sampling); their own children are sampled every
    :data:`SAMPLE_SECONDS`."""

    def __init__(self) -> None:
        self.root = os.getpid()
        self.commands: Dict[int, str] = {self.root: "this test process"}
        self._done = threading.Event()
        started = subprocess.Popen.__init__
        commands = self.commands

        def recorded(popen: subprocess.Popen, *args: object, **kwargs: object) -> None:
            started(popen, *args, **kwargs)  # type: ignore[arg-type]
            given = popen.args
            text = " ".join(map(str, given)) if isinstance(given, (list, tuple)) else str(given)
            commands[popen.pid] = text[:200]

        subprocess.Popen.__init__ = recorded  # type: ignore[method-assign]
        self._thread = threading.Thread(target=self._sample, daemon=True, name="denseccl-descendants")
        self._thread.start()

    def _sample(self) -> None:
        while not self._done.wait(SAMPLE_SECONDS):
            self.sample()

    def sample(self) -> None:
        parents: Dict[int, int] = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat") as handle:
                        parents[int(entry)] = int(handle.read().rsplit(")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    continue
        for pid in parents:
            chain, ancestor = [], pid
            while ancestor in parents and ancestor not in self.commands and ancestor != 1 and len(chain) < 64:
                chain.append(ancestor)
                ancestor = parents[ancestor]
            if ancestor in self.commands and chain:
                for member in chain:
                    self.commands[member] = _command(member)

    def stop(self) -> None:
        self._done.set()
        self.sample()

    def segments(self) -> Dict[str, str]:
        """Singleton segments in /dev/shm named by one of these processes (MPICH names a
        singleton's by its pid), each with the command of the process that made it."""
        found = {}
        for name in _names():
            match = SEGMENT.match(name)
            if match:
                pid = int(match.group(1), 16)
                if pid in self.commands:
                    found[name] = self.commands[pid]
        return found


def _command(pid: int) -> str:
    try:
        return (Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
                or f"pid {pid}")[:200]
    except OSError:
        return f"pid {pid}"


def left_by(jobs: Iterable[Job]) -> Set[str]:
    """The segments of ``jobs`` still in /dev/shm."""
    return set().union(*(job.segments() for job in jobs))


def _names() -> List[str]:
    try:
        return os.listdir(SHM)
    except FileNotFoundError:
        return []


def owners(names: Set[str]) -> List[str]:
    """``pid (command): name`` for each live process that maps one of ``names``."""
    found = []
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            mapped = {name for name in names if f"/dev/shm/{name}" in maps.read_text()}
            command = (maps.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:80]
        except OSError:
            continue
        found += [f"{maps.parent.name} ({command.strip()}): {name}" for name in sorted(mapped)]
    return found
