"""A board's page without MPI: a shared-memory segment that lives in /dev/shm only while the
ranks of a host attach to it.

Why not ``multiprocessing.shared_memory``: its resource tracker registers every segment a
process opens and, at exit, unlinks it (or warns that it "leaked") in whichever process ends
first (before Python 3.13, attaching processes too), and it cannot open with ``O_NOFOLLOW``.
Plain ``os.open`` + ``mmap`` on ``/dev/shm/NAME`` is what ``shm_open`` does on Linux, with the
flags chosen here:

- the host's first rank creates it with ``O_CREAT | O_EXCL | O_NOFOLLOW``, mode 0600, under a
  name no one can guess (``secrets``); the creating pid is part of the name so that a test can
  tell its own job's segments from others';
- every other rank opens it with ``O_NOFOLLOW`` and checks that it is a regular file of the
  expected size, owned by this user;
- it is unlinked as soon as every rank of the host has mapped it (hosts.py), so nothing is left
  in /dev/shm if a rank is killed later: the mappings stay valid without the name, and the
  kernel frees the memory with the last one (as torch's ``file_descriptor`` sharing does).

The size is zero-filled by ``ftruncate``: a fresh board reads all zeros.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import re
import secrets
import stat
from typing import Any, List, Optional

#: where POSIX shared memory lives on Linux
SHM = "/dev/shm"
#: segment names: ``denseccl-<creator pid>-<32 hex digits>``
PREFIX = "denseccl-"
NAME = re.compile(r"^denseccl-\d+-[0-9a-f]{32}$")
#: mappings kept for the process's life: a retired board's flag may still be read, and a
#: process's doorbells sleep in its host's mapping
KEPT: List[Any] = []


def available() -> bool:
    """Whether this system has a /dev/shm to map segments from."""
    return os.path.isdir(SHM)


def identity() -> str:
    """Which /dev/shm this process sees: its mount's device and inode. Two containers (or
    simulated hosts) with a /dev/shm of their own differ here even on one machine."""
    try:
        info = os.stat(SHM)
    except OSError:
        return ""
    return f"{info.st_dev}:{info.st_ino}"


class Segment:
    """One mapped segment (``map``: the ``mmap``; ``address``: where it starts, for futexes)."""

    def __init__(self, name: str, mapping: mmap.mmap) -> None:
        self.name = name
        self.map = mapping
        self._anchor: Any = ctypes.c_char.from_buffer(mapping)
        self.address = ctypes.addressof(self._anchor)

    @classmethod
    def create(cls, nbytes: int) -> "Segment":
        """A new segment of ``nbytes`` (zeroed), mode 0600, under a fresh unguessable name."""
        name = f"{PREFIX}{os.getpid()}-{secrets.token_hex(16)}"
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
        descriptor = os.open(os.path.join(SHM, name), flags, 0o600)
        try:
            os.fchmod(descriptor, 0o600)  # whatever the umask
            os.ftruncate(descriptor, nbytes)
            return cls(name, mmap.mmap(descriptor, nbytes))
        except BaseException:
            unlink(name)
            raise
        finally:
            os.close(descriptor)

    @classmethod
    def attach(cls, name: str, nbytes: int) -> "Segment":
        """The segment ``name`` that a peer created: OSError where it is not there, not a plain
        file of ``nbytes`` owned by this user, or a link."""
        if not NAME.match(name):
            raise OSError(f"not a denseccl segment name: {name!r}")
        descriptor = os.open(os.path.join(SHM, name), os.O_RDWR | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
        try:
            info = os.fstat(descriptor)
            if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_size != nbytes:
                raise OSError(f"{SHM}/{name} is not the segment a peer made (owner, kind or size differ)")
            return cls(name, mmap.mmap(descriptor, nbytes))
        finally:
            os.close(descriptor)

    def view(self, start: int, stop: int) -> memoryview:
        """Bytes ``start:stop`` of the segment."""
        return memoryview(self.map)[start:stop]

    def close(self) -> None:
        """Unmap, where no view of it is left; else keep it mapped for the process's life."""
        self._anchor = None
        try:
            self.map.close()
        except BufferError:  # doorbells or a retired board still read it
            KEPT.append(self)

    def retire(self) -> None:
        """Keep it mapped for the process's life (a wait may still read it)."""
        KEPT.append(self)


def unlink(name: Optional[str]) -> None:
    """Remove ``name`` from /dev/shm (mappings stay valid); nothing if it is gone already."""
    if name and NAME.match(name):
        try:
            os.unlink(os.path.join(SHM, name))
        except FileNotFoundError:
            pass


__all__ = ["KEPT", "NAME", "PREFIX", "SHM", "Segment", "available", "identity", "unlink"]
