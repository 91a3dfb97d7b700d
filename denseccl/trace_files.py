"""Where the flight recorder's dumps go, and how they are written on a host other users share.

Every job dumps into a folder of its own, ``<base>/<job>``, so that two jobs on one host never
overwrite each other's dumps. ``<job>`` is agreed by the ranks of each communicator when it is
created (:func:`agree_job`): rank 0's id, which a process keeps for all its communicators, made
of the UTC time and 8 random hex digits (``20261204-183000-5f0c9a1e``). It comes from no
launcher variable, so it is the same under mpiexec, srun, torchrun, ``mp.spawn`` and a store
launch, and two jobs never share it, even under a launcher that reuses its ids.
``<base>`` is the folder a dump is given, else ``DENSECCL_TRACE_DIR``, else
``denseccl-trace-<uid>`` in the temporary directory (:func:`config.trace_dir`).

Another user of the host may have made a name first (``/tmp`` is everyone's), so nothing is
trusted by its name:

- the per-user default folder and the job folder are made with mode 0700 and opened without
  following a symlink (``O_NOFOLLOW``); each must belong to this user and be writable by no
  one else, else :class:`UnsafeFolder`. A ``DENSECCL_TRACE_DIR`` the user names is theirs to
  choose (a symlink or a team's folder there is fine); the job folder inside it is checked.
- files are made relative to the opened job folder (``dir_fd``), so a folder renamed or
  replaced after the checks receives nothing: a temporary made with ``O_CREAT | O_EXCL |
  O_NOFOLLOW`` and mode 0600, then renamed over the dump's name (a reader never sees half a
  dump). A symlink at the dump's name is refused, not written through or replaced.
"""

from __future__ import annotations

import os
import re
import secrets
import stat
import time
from typing import Any, Optional, Tuple

from . import config
from .errors import DenseCCLError

#: flags of a folder opened to make files in: never through a symlink
_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: flags of a dump's temporary: a new file, never through a symlink
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
#: what a job id agreed with peers may look like: one plain name, never a path
_JOB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")

#: the job id of this process: the first one its communicators agreed on
_job: Optional[str] = None


class UnsafeFolder(DenseCCLError):
    """A dump folder that another user could read or redirect: nothing was written."""


def new_job_id() -> str:
    """A fresh job id: the UTC time and 8 random hex digits (sorts by time)."""
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(4)


def agree_job(control: Any, size: int, deadline: Optional[float]) -> str:
    """The job id of a new communicator of ``size`` ranks: rank 0's, gathered over ``control``
    (collective: every rank of the communicator calls it). A process offers the first id it
    agreed on, so that its communicators (splits, subgroups) share the job's folder."""
    global _job
    mine = _job or new_job_id()
    agreed = mine
    if size > 1:
        agreed = bytes(control.allgather_bytes(mine.encode(), deadline)[0]).decode("ascii", "replace")
    if not _JOB_NAME.fullmatch(agreed):  # a peer of another version: never a path from the wire
        agreed = mine
    if _job is None:
        _job = agreed
    return agreed


def local_job() -> str:
    """This process's job id without asking peers (a recorder made outside a communicator)."""
    global _job
    if _job is None:
        _job = new_job_id()
    return _job


def base_folder(directory: Optional[str]) -> Tuple[str, bool]:
    """The folder the job folders go in, and whether the user named it (``directory``, else
    ``DENSECCL_TRACE_DIR``) rather than it being the per-user default."""
    named = directory or config.settings().trace_dir
    return (named, True) if named else (config.trace_dir(), False)


def job_folder(directory: Optional[str], job: str) -> str:
    """The path of job ``job``'s dump folder (nothing is made or checked)."""
    return os.path.join(base_folder(directory)[0], job)


def open_job_folder(directory: Optional[str], job: str) -> Tuple[int, str]:
    """The job's dump folder, made if needed and checked: an open descriptor and its path.
    :class:`UnsafeFolder` when it, or the per-user default above it, fails a check."""
    base, named = base_folder(directory)
    if named:
        os.makedirs(base, mode=0o700, exist_ok=True)
        parent = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)  # the user's choice, links and all
    else:
        above, name = os.path.split(base)
        top = os.open(above or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            parent = _own_folder(top, name, base, "the default dump folder")
        finally:
            os.close(top)
    try:
        return _own_folder(parent, job, os.path.join(base, job), "the job's dump folder"), os.path.join(base, job)
    finally:
        os.close(parent)


def _own_folder(parent: int, name: str, path: str, what: str) -> int:
    """Folder ``name`` of the open folder ``parent``, made with mode 0700 if absent, opened
    without following a link; it must belong to this user and be writable by no one else."""
    try:
        os.mkdir(name, 0o700, dir_fd=parent)
    except FileExistsError:
        pass
    fix = "set DENSECCL_TRACE_DIR to a folder of your own"
    try:
        fd = os.open(name, _FOLDER, dir_fd=parent)
    except OSError as error:  # ELOOP: a symlink; ENOTDIR: a file
        raise UnsafeFolder(f"{what} {path} is a symlink or not a folder ({error.strerror}); {fix}") from None
    info = os.fstat(fd)
    problem = None
    if info.st_uid != os.geteuid():
        problem = f"belongs to uid {info.st_uid}, not to this user (uid {os.geteuid()}): someone else made it first"
    elif info.st_mode & 0o022:
        problem = f"is writable by others (mode {stat.S_IMODE(info.st_mode):o})"
    if problem is not None:
        os.close(fd)
        raise UnsafeFolder(f"{what} {path} {problem}; {fix}")
    return fd


def write(folder: int, name: str, text: str) -> None:
    """Write ``text`` as file ``name`` of the open folder ``folder``: a new temporary (mode
    0600), renamed over ``name``. :class:`UnsafeFolder` when ``name`` is a symlink."""
    try:
        if stat.S_ISLNK(os.stat(name, dir_fd=folder, follow_symlinks=False).st_mode):
            raise UnsafeFolder(f"the dump's name {name} is a symlink in its folder; remove it or use another folder")
    except FileNotFoundError:
        pass
    partial = f".{name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    fd = os.open(partial, _NEW_FILE, 0o600, dir_fd=folder)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(partial, name, src_dir_fd=folder, dst_dir_fd=folder)  # a reader never sees half a dump
    except BaseException:
        try:
            os.unlink(partial, dir_fd=folder)
        except OSError:
            pass
        raise


__all__ = [
    "UnsafeFolder", "agree_job", "base_folder", "job_folder", "local_job", "new_job_id", "open_job_folder", "write",
]
