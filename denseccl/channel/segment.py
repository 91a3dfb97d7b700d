"""The board's page: anonymous shared memory (``memfd_create``) that a host's first rank
makes and hands to the host's other ranks over a Unix socket (``SCM_RIGHTS``).

Why not a file in /dev/shm (``shm_open``, ``multiprocessing.shared_memory``):

- /dev/shm is often small (Docker's default is 64 MiB, shared with DataLoader workers) and
  tmpfs allocates a page when it is first touched, so a full /dev/shm turns the first write
  into SIGBUS. A memfd is not bounded by /dev/shm's size, and its pages are reserved when it is
  made (``posix_fallocate``): no room is an ``OSError`` there, which the set-up turns into
  "no shared memory" on every rank of the host (hosts.py), never a signal later.
- A name in /dev/shm outlives a rank killed before it is unlinked (SIGKILL, or SIGTERM during
  set-up), and any local user can list it. A memfd has no name: the kernel frees its memory
  with the last descriptor or mapping, whatever way the processes end.

The hand-over: the creator listens on an abstract Unix socket under an unguessable name
(``secrets``), which only processes of its network namespace can reach; it gives the descriptor
only to a peer of its own user (``SO_PEERCRED``), as many as announced. Each receiver checks
that it got a memfd of the size announced and maps it. Processes of one user may read each
other's memory anyway (ptrace), so nothing is exposed beyond that.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import secrets
import socket
import stat
import struct
import sys
import time
from typing import Any, Optional

#: an abstract socket's name: a NUL, then this prefix and 32 hex digits
PREFIX = "denseccl-"
_CREDENTIALS = struct.Struct("3i")  # struct ucred: pid, uid, gid


def available() -> bool:
    """Whether this system can make and hand over segments (Linux, Python 3.9+)."""
    return sys.platform.startswith("linux") and hasattr(os, "memfd_create") and hasattr(socket, "send_fds")


def identity() -> str:
    """Which processes can meet on an abstract socket with this one: its network namespace.
    Containers or simulated hosts on one machine with a network of their own differ here."""
    try:
        return str(os.stat("/proc/self/ns/net").st_ino)
    except OSError:
        return ""


class Segment:
    """One mapped segment (``map``: the ``mmap``; ``address``: where it starts, for futexes).
    The mapping lives while any view of it does: :meth:`close` unmaps it at once where no view
    is left, else the last view's release does."""

    def __init__(self, mapping: mmap.mmap) -> None:
        self.map = mapping
        self._anchor: Any = ctypes.c_char.from_buffer(mapping)
        self.address = ctypes.addressof(self._anchor)

    @staticmethod
    def make(nbytes: int) -> int:
        """A new memfd of ``nbytes`` (zeroed), its pages reserved: OSError where there is no room."""
        descriptor = os.memfd_create("denseccl", os.MFD_CLOEXEC)
        try:
            os.ftruncate(descriptor, nbytes)
            os.posix_fallocate(descriptor, 0, nbytes)  # no room: ENOSPC or ENOMEM now, not SIGBUS later
        except BaseException:
            os.close(descriptor)
            raise
        return descriptor

    @classmethod
    def map_descriptor(cls, descriptor: int, nbytes: int) -> "Segment":
        """Map the memfd ``descriptor`` of ``nbytes``: OSError where it is anything else."""
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_size != nbytes:
            raise OSError(f"the descriptor handed over is not the segment announced ({nbytes} bytes, this user's)")
        return cls(mmap.mmap(descriptor, nbytes))

    def view(self, start: int, stop: int) -> memoryview:
        """Bytes ``start:stop`` of the segment."""
        return memoryview(self.map)[start:stop]

    def close(self) -> None:
        """Unmap now where no view is left; else the mapping goes with its last view."""
        self._anchor = None
        try:
            self.map.close()
        except BufferError:  # a view still reads it (doorbells, a retired board's flag): it holds the mapping
            pass


class Handout:
    """The creator's side of the hand-over: a listening abstract socket for ``descriptor``."""

    def __init__(self, descriptor: int, backlog: int) -> None:
        self.descriptor = descriptor
        self.name = f"{PREFIX}{secrets.token_hex(16)}"
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            self._socket.bind("\0" + self.name)
            self._socket.listen(max(backlog, 1))
        except BaseException:
            self._socket.close()
            raise

    def give(self, count: int, deadline: Optional[float]) -> None:
        """Hand the descriptor to ``count`` peers that have connected (they announced it):
        OSError where one is not of this user or does not come by ``deadline``."""
        for _ in range(count):
            self._socket.settimeout(None if deadline is None else max(deadline - time.monotonic(), 0.001))
            connection, _ = self._socket.accept()
            with connection:
                _, uid, _ = _CREDENTIALS.unpack(
                    connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CREDENTIALS.size)
                )
                if uid != os.geteuid():
                    raise OSError(f"a process of user {uid} asked for this host's segment")
                socket.send_fds(connection, [b"s"], [self.descriptor])

    def close(self) -> None:
        """Stop listening and close the descriptor (the mappings stay); again: nothing."""
        self._socket.close()
        descriptor, self.descriptor = self.descriptor, -1
        if descriptor >= 0:
            os.close(descriptor)


def connect(name: str) -> socket.socket:
    """The receiver's connection to the creator's :class:`Handout` ``name`` (before the
    creator gives: the connection waits in its backlog)."""
    if not (name.startswith(PREFIX) and len(name) == len(PREFIX) + 32):
        raise OSError(f"not a denseccl segment name: {name!r}")
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        connection.connect("\0" + name)
    except BaseException:
        connection.close()
        raise
    return connection


def receive(connection: socket.socket, nbytes: int, deadline: Optional[float]) -> Segment:
    """The segment of ``nbytes`` that the creator gives on ``connection`` (then closed)."""
    with connection:
        connection.settimeout(None if deadline is None else max(deadline - time.monotonic(), 0.001))
        _, descriptors, _, _ = socket.recv_fds(connection, 1, 1)
    if len(descriptors) != 1:
        for descriptor in descriptors:
            os.close(descriptor)
        raise OSError("the creator of this host's segment sent no descriptor")
    try:
        return Segment.map_descriptor(descriptors[0], nbytes)
    finally:
        os.close(descriptors[0])


__all__ = ["Handout", "PREFIX", "Segment", "available", "connect", "identity", "receive"]
