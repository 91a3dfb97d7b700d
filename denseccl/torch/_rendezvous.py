"""Rendezvous for a job started by an MPI launcher: rank and world size from MPI, and a
``TCPStore`` that rank 0 opens on a free port and announces over MPI, so that
``dist.init_process_group("denseccl")`` needs no other argument under ``mpiexec``.

It is the handler of ``denseccl://`` and, in a process an MPI launcher started, also answers
``env://`` (torch's default) when ``MASTER_ADDR`` / ``MASTER_PORT`` are not set; with them set,
or in any other launch, torch's own env:// runs unchanged. Every step honours the timeout: a
rank that never calls it makes the others raise :class:`CollectiveTimeoutError`.
"""

from __future__ import annotations

import datetime
import importlib
import os
import socket
import time
from typing import Any, Iterator, Optional, Tuple
from urllib.parse import parse_qs, urlparse

import torch.distributed as dist

from ..config import launched_by_mpi
from ..errors import CollectiveTimeoutError

SCHEME = "denseccl"
DEFAULT_TIMEOUT = datetime.timedelta(minutes=30)


def mpi_store(timeout: datetime.timedelta) -> Tuple[Any, int, int]:
    """``(store, rank, world size)`` of MPI's world; collective over it."""
    from mpi4py import MPI  # noqa: PLC0415

    from ..backends.base import abandon  # noqa: PLC0415
    from ..wait import wait_until  # noqa: PLC0415

    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    seconds = timeout.total_seconds()
    deadline = time.monotonic() + seconds if seconds > 0 else None
    request = world.Ibarrier()  # nonblocking: a rank that never comes cannot hold the others forever
    try:
        wait_until(request.Test, deadline, "the MPI rendezvous (every rank must call init_process_group)")
    except CollectiveTimeoutError:
        abandon(request)
        raise
    hosts = world.allgather(socket.gethostname())
    host = "127.0.0.1" if len(set(hosts)) == 1 else hosts[0]
    store = dist.TCPStore(host, 0, size, is_master=True, timeout=timeout, wait_for_workers=False) if rank == 0 else None
    port = world.bcast(store.port if store is not None else None, root=0)
    if store is None:
        store = dist.TCPStore(host, port, size, is_master=False, timeout=timeout)
    return store, rank, size


def _handler(url: str, timeout: datetime.timedelta = DEFAULT_TIMEOUT, **kwargs: Any) -> Iterator[Tuple[Any, int, int]]:
    store, rank, size = mpi_store(timeout)
    query = {k: v[-1] for k, v in parse_qs(urlparse(url).query).items()}
    for name, mine in (("rank", rank), ("world_size", size)):
        if name in query and int(query[name]) not in (-1, mine):
            from ..errors import DenseCCLError  # noqa: PLC0415

            raise DenseCCLError(
                f"denseccl: {name}={query[name]} was passed, but MPI says {mine}; the torch rank must be the MPI rank "
                "because CPU tensors move over MPI. Leave rank and world_size out under mpiexec"
            )
    yield store, rank, size
    raise RuntimeError("denseccl:// cannot rendezvous again")


def needs_mpi_rendezvous(environ: Optional[dict] = None) -> bool:
    """An MPI launch without the env:// variables of a torchrun-style one."""
    source = os.environ if environ is None else environ
    return launched_by_mpi(source) and not (source.get("MASTER_ADDR") and source.get("MASTER_PORT"))


def register() -> None:
    """Register ``denseccl://``; under an MPI launch, let ``env://`` fall back to it."""
    module = importlib.import_module("torch.distributed.rendezvous")  # the name alone is a function
    handlers = module._rendezvous_handlers  # torch has no public way to extend env://
    if SCHEME not in handlers:
        module.register_rendezvous_handler(SCHEME, _handler)
    original = handlers.get("env")
    if launched_by_mpi() and original is not None and not getattr(original, "denseccl", False):

        def env(url: str, **kwargs: Any) -> Any:
            return (_handler if needs_mpi_rendezvous() else original)(url, **kwargs)

        env.denseccl = True  # type: ignore[attr-defined]
        handlers["env"] = env


__all__ = ["SCHEME", "mpi_store", "needs_mpi_rendezvous", "register"]
