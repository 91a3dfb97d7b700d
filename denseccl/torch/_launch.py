"""Which engine moves a process group's CPU tensors, and the MPI side of a group's launch.

A job started by an MPI launcher (mpiexec, mpirun, srun with PMI) moves CPU tensors over MPI:
the group needs an MPI communicator whose ranks are torch's ranks in the same order, which this
module builds, refusing with a message that says how to launch when torch's rank or world size
disagrees with MPI's. Any other launch (torchrun, ``mp.spawn``, env://, file://, tcp://) moves
them over the gloo engine (denseccl/backends/gloo/transport.py), made from the group's own store.

Here too is the ``denseccl://`` rendezvous of an MPI launch, which also answers ``env://``
without ``MASTER_ADDR`` / ``MASTER_PORT``; with them but without ``RANK`` / ``WORLD_SIZE`` (cluster
scripts export the address alone), ``env://`` takes the rank and size from the launcher: MPI's
under mpiexec, mpirun or srun with PMI, srun's own without MPI (docs/torch.md, Launching);
under srun without MPI and without them, the step's first node and a port from its ids.
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

from ..transport import abandon
from ..backends.mpi.init import import_mpi
from ..backends.rendezvous import SRUN_VARIABLES
from ..backends.slurm import srun_address
from ..backends.store import wait_for_keys
from ..config import launched_by_mpi
from ..errors import CollectiveTimeoutError, DenseCCLError
from ..wait import deadline_after, wait_until

SCHEME = "denseccl"
DEFAULT_TIMEOUT = datetime.timedelta(minutes=30)
#: what srun sets in each task it starts: its rank, and the size of its step (the batch script
#: itself has SLURM_PROCID and SLURM_NTASKS but is no step of many tasks: it has neither of these two)
SLURM_RANK, SLURM_STEP_SIZE = SRUN_VARIABLES["RANK"], SRUN_VARIABLES["WORLD_SIZE"]
#: env://'s query parameters and the variables torch reads them from otherwise
ENV_PLACE = (("rank", "RANK"), ("world_size", "WORLD_SIZE"))


def mpi_store(timeout: datetime.timedelta) -> Tuple[Any, int, int]:
    """``(store, rank, world size)`` of MPI's world; collective over it."""
    MPI = import_mpi("the denseccl:// rendezvous")

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


def launched_by_srun() -> bool:
    """Whether srun started this process as a task of a job step (with or without MPI)."""
    return bool(os.environ.get(SLURM_RANK, "").isdigit() and os.environ.get(SLURM_STEP_SIZE, "").isdigit())


def launcher_place() -> Optional[Tuple[int, int]]:
    """``(rank, size)`` as the launcher says: MPI's world under an MPI launcher (the ranks the
    MPI engine needs), else srun's ``SLURM_PROCID`` and ``SLURM_STEP_NUM_TASKS``; None when
    neither started this process."""
    if launched_by_mpi():
        MPI = import_mpi("a job started by an MPI launcher")  # mpi4py must be there: say how to install it

        return MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    if launched_by_srun():
        return int(os.environ[SLURM_RANK]), int(os.environ[SLURM_STEP_SIZE])
    return None


def with_launcher_place(url: str) -> str:
    """``url`` (env://) with the rank and world size the launcher gives, where neither its query
    nor ``RANK`` / ``WORLD_SIZE`` gives them (torch's env:// would refuse: "environment
    variable RANK expected, but not set")."""
    parsed = urlparse(url)
    given = parse_qs(parsed.query)
    missing = [name for name, variable in ENV_PLACE if name not in given and not os.environ.get(variable)]
    place = launcher_place() if missing else None
    if place is None:
        return url
    values = dict(zip((name for name, _ in ENV_PLACE), place))
    added = "&".join(f"{name}={values[name]}" for name in missing)
    return f"{url}{'&' if parsed.query else '?'}{added}"


def srun_tcp_url(url: str) -> Optional[str]:
    """Under srun without a PMI and without ``MASTER_ADDR`` or ``MASTER_PORT``: ``url`` (env://,
    with its rank and world size) as the ``tcp://`` url of the step's own meeting point, the
    first node and a port from the job and step ids (backends/slurm.py); else None."""
    if os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT"):
        return None
    derived = srun_address(os.environ)
    if derived is None:
        return None
    host = os.environ.get("MASTER_ADDR") or derived[0]
    port = os.environ.get("MASTER_PORT") or str(derived[1])
    query = {k: v[-1] for k, v in parse_qs(urlparse(url).query).items()}
    for name, variable in ENV_PLACE:
        if name not in query and os.environ.get(variable):
            query[name] = os.environ[variable]
    return f"tcp://{host}:{port}?" + "&".join(f"{k}={v}" for k, v in query.items())


def register() -> None:
    """Register ``denseccl://``; under an MPI launch, let ``env://`` fall back to it, and under an
    MPI launch or srun, let ``env://`` take the rank and world size from the launcher (and, under
    srun without a PMI, the address from Slurm where ``MASTER_ADDR`` / ``MASTER_PORT`` are not set)."""
    module = importlib.import_module("torch.distributed.rendezvous")  # the name alone is a function
    handlers = module._rendezvous_handlers  # torch has no public way to extend env://
    if SCHEME not in handlers:
        module.register_rendezvous_handler(SCHEME, _handler)
    original = handlers.get("env")
    launched = launched_by_mpi() or launched_by_srun()
    if launched and original is not None and not getattr(original, "denseccl", False):

        def env(url: str, **kwargs: Any) -> Any:
            if needs_mpi_rendezvous():
                return _handler(url, **kwargs)
            placed = with_launcher_place(url)
            derived = srun_tcp_url(placed)
            if derived is not None:
                return handlers["tcp"](derived, **kwargs)
            return original(placed, **kwargs)

        env.denseccl = True  # type: ignore[attr-defined]
        handlers["env"] = env


def host_engine() -> str:
    """``"mpi"`` under an MPI launcher (mpi4py must then be installed), else ``"gloo"``."""
    if launched_by_mpi():
        import_mpi("denseccl: a job started by mpiexec (CPU tensors move over MPI)")
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
    MPI = import_mpi("denseccl: CPU tensors of an MPI launch")

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
