"""Who am I: :func:`init` chooses a backend (an argument, ``DENSECCL_BACKEND``, or the launch:
mpiexec gives MPI, a torchrun-style environment or a ``store`` gives gloo, a GPU with NCCL gives
NCCL), has that backend's set-up (backends/mpi, backends/gloo, backends/nccl) return its
transport and control channel, and builds the Communicator on them, here only.
Every step of the bootstrap honours ``timeout``: a peer that never calls ``init`` makes it raise
:class:`CollectiveTimeoutError` on the others.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Optional, Union

from .. import config, log
from ..communicator import Communicator
from ..errors import DenseCCLError
from ..wait import deadline_after
from ..backends.gloo.init import init_gloo
from ..backends.mpi.init import init_mpi
from ..backends import rendezvous
from ..backends.nccl import init as nccl

#: the options of ``init(**options)`` that each backend takes
OPTIONS = {
    "mpi": (),
    "gloo": ("store", "rank", "size", "prefix"),
    "nccl": ("store", "rank", "size", "device", "prefix"),
}


def init(
    backend: Optional[str] = None,
    *,
    check: Union[None, bool, str] = None,
    timeout: config.Seconds = None,
    comm: Any = None,
    on_timeout: Optional[str] = None,
    **options: Any,
) -> Communicator:
    """Create a Communicator.

    ``backend``: ``"mpi"`` (host arrays over mpi4py), ``"gloo"`` (host arrays over torch's gloo,
    for launches without MPI), ``"nccl"`` (device arrays over NCCL) or None to choose:
    ``DENSECCL_BACKEND`` if set, else NCCL where a GPU and NCCL are present, else gloo under a
    torchrun-style launch (or with ``store=``) that no MPI launcher started, else MPI.
    ``store``, ``rank``, ``size`` (gloo, nccl): a torch key-value store for the ranks to meet
    on. ``comm``: an mpi4py communicator to build on (default ``MPI.COMM_WORLD``; under mpiexec
    nothing else is needed). ``check``: ``"always"`` (default) checks that every
    rank holds the same descriptor before each collective; ``"off"`` skips that, and then a rank
    whose input is invalid raises alone while its peers wait until the timeout. ``timeout``:
    seconds (or a ``datetime.timedelta``) a rank waits for its peers before
    :class:`CollectiveTimeoutError` (default ``DENSECCL_TIMEOUT``, else 300; 0 waits forever).
    ``on_timeout``: ``"raise"`` (default ``DENSECCL_ON_TIMEOUT``, else raise) raises that error
    and tells the peers, whose current or next call then raises
    :class:`CommunicatorBrokenError`; ``"abort"`` ends the whole job instead (docs/faults.md).
    """
    seconds = config.timeout(timeout)
    policy = config.on_timeout(on_timeout)
    deadline = deadline_after(seconds)  # one deadline for every bootstrap step, choosing the backend included
    given = backend
    backend = (backend or config.settings().backend or _default_backend(options)).lower()
    checking = config.settings().check if check is None else config.flag(check, "check")
    _log_decisions(given, backend, check, checking, seconds)
    if backend not in OPTIONS:
        raise DenseCCLError(f"unknown backend {backend!r}: use 'mpi' or 'gloo' (host arrays) or 'nccl' (device arrays)")
    unexpected = sorted(set(options) - set(OPTIONS[backend]))
    if unexpected:
        raise DenseCCLError(
            f"unexpected options for the {backend} backend: {', '.join(unexpected)} "
            f"(known: {', '.join(OPTIONS[backend]) or 'none'})"
        )
    if backend == "mpi":
        transport, control = init_mpi(comm, deadline)
    elif backend == "gloo":
        transport, control = init_gloo(seconds, deadline, **options)
    else:
        transport, control = nccl.init_nccl(comm, seconds, deadline, **options)
    return Communicator(transport, control, check=checking, timeout=seconds, on_timeout=policy)


def _default_backend(options: Any = None) -> str:
    """NCCL when a GPU and NCCL are usable here; else gloo under a launch that is not MPI's
    (torchrun-style variables, or a store given) where torch is installed; else MPI."""
    if nccl.nccl_usable():
        return "nccl"
    if (options and options.get("store") is not None) or (rendezvous.env_launch() and not config.launched_by_mpi()):
        try:
            import torch.distributed  # noqa: F401, PLC0415
        except ImportError:
            return "mpi"
        return "gloo"
    return "mpi"


# -- DENSECCL_DEBUG=INFO: what the bootstrap decided, and why --------------------------------------


def _log_decisions(given: Optional[str], backend: str, check: Any, checking: bool, seconds: Optional[float]) -> None:
    if not log.logger.isEnabledFor(logging.INFO):
        return
    for name in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "RANK"):  # the rank, before a communicator says
        if os.environ.get(name, "").isdigit():
            log.set_rank(int(os.environ[name]))
            break
    source = "the argument" if given else "DENSECCL_BACKEND" if config.settings().backend else "the default"
    if source == "the default" and backend != "nccl":
        source += f" (not nccl: {nccl.nccl_missing()})"
    log.info("init: backend %s, from %s", backend, source)
    log.info(
        "init: agreement check %s (from %s), timeout %s",
        "always" if checking else "off",
        "the argument" if check is not None else "DENSECCL_CHECK or the default",
        "none" if seconds is None else f"{seconds:g} s",
    )


__all__ = ["init"]
