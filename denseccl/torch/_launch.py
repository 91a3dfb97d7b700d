"""Which engine moves a process group's CPU tensors, and the MPI side of a group's launch.

A job started by an MPI launcher (mpiexec, mpirun, srun with PMI) moves CPU tensors over MPI:
the group needs an MPI communicator whose ranks are torch's ranks in the same order, which this
module builds, refusing with a message that says how to launch when torch's rank or world size
disagrees with MPI's. Any other launch (torchrun, ``mp.spawn``, env://, file://, tcp://) moves
them over the gloo engine (denseccl/backends/gloo/transport.py), made from the group's own store.

Here too is the ``denseccl://`` rendezvous of an MPI launch, which also answers ``env://``
without ``MASTER_ADDR`` / ``MASTER_PORT`` (docs/torch.md, Launching).
"""

from __future__ import annotations

import datetime
import importlib
import os
import socket
import time
from typing import Any, Iterator, Optional, Sequence, Tuple
from urllib.parse import parse_qs, urlparse

import torch.distributed as dist

from ..backends.base import abandon
from ..backends.store import wait_for_keys
from ..config import launched_by_mpi
from ..errors import CollectiveTimeoutError, DenseCCLError
from ..wait import deadline_after, wait_until

SCHEME = "denseccl"
DEFAULT_TIMEOUT = datetime.timedelta(minutes=30)


def mpi_store(timeout: datetime.timedelta) -> Tuple[Any, int, int]:
    """``(store, rank, world size)`` of MPI's world; collective over it."""
    from mpi4py import MPI  # noqa: PLC0415

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
            raise DenseCCLError(
                f"denseccl: {name}={query[name]} was passed, but MPI says {mine}; the torch rank must be the MPI rank "
                "because CPU tensors move over MPI. Leave rank and world_size out under mpiexec"
            )
    yield store, rank, size
    raise RuntimeError("denseccl:// cannot rendezvous again")


def needs_mpi_rendezvous() -> bool:
    """An MPI launch without the env:// variables of a torchrun-style one."""
    return launched_by_mpi() and not (os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT"))


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


def host_engine() -> str:
    """``"mpi"`` under an MPI launcher (mpi4py must then be installed), else ``"gloo"``."""
    if launched_by_mpi():
        try:
            import mpi4py.MPI  # noqa: F401, PLC0415
        except ImportError as error:
            raise DenseCCLError(
                f"denseccl: the job was started by mpiexec but mpi4py is missing ({error}): pip install 'denseccl[mpi]'"
            ) from None
        return "mpi"
    if not dist.is_gloo_available():
        raise DenseCCLError(
            "denseccl: this torch was built without gloo, which moves CPU tensors when no MPI launcher started the "
            "job; launch with mpiexec (pip install 'denseccl[mpi]')"
        )
    return "gloo"


def arrive(store: Any, rank: int, size: int, timeout: Optional[float], what: str) -> None:
    """Return once every rank of a group has reached this point (each sets its key on the
    group's store); CollectiveTimeoutError after ``timeout`` seconds. Run before a blocking
    collective setup step, so that a member that never comes cannot hold the others forever."""
    store.set(f"denseccl/arrived/{rank}", b"1")
    wait_for_keys(store, [f"denseccl/arrived/{r}" for r in range(size)], deadline_after(timeout), what)


def mpi_group(rank: int, size: int, global_ranks: Sequence[int]) -> Tuple[Any, bool]:
    """The mpi4py communicator of a group's ranks, and whether it was created for a subgroup
    (then the group frees it). ``global_ranks`` lists a subgroup's members (any ranks) in
    group-rank order and is empty for the default group (as torch passes it), which is MPI's
    world. Raises when torch's ranks are not MPI's."""
    from mpi4py import MPI  # noqa: PLC0415

    world = MPI.COMM_WORLD
    default = not global_ranks
    members = list(range(size)) if default else [int(r) for r in global_ranks]
    if (default and world.Get_size() != size) or max(members) >= world.Get_size():
        raise DenseCCLError(
            f"denseccl: torch's process group has {size if default else max(members) + 1} ranks but MPI has "
            f"{world.Get_size()}: launch with mpiexec -n {size}, or pass world_size={world.Get_size()} to "
            "init_process_group"
        )
    mine = members[rank]
    if world.Get_rank() != mine:
        raise DenseCCLError(
            f"denseccl: torch rank {mine} is MPI rank {world.Get_rank()}; the two must match because CPU tensors "
            "move over MPI. Pass rank=MPI.COMM_WORLD.Get_rank() (and world_size=MPI.COMM_WORLD.Get_size()) to "
            "init_process_group, or set RANK from the launcher (PMI_RANK under mpiexec); "
            "denseccl.torch.init_process_group() does this for you"
        )
    if default:
        return world, False
    group = world.Get_group()
    subset = group.Incl(members)
    base = world.Create_group(subset)
    subset.Free()
    group.Free()
    return base, True
