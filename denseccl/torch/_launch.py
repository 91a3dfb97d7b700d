"""Which engine moves a process group's CPU tensors, and the MPI side of a group's launch.

A job started by an MPI launcher (mpiexec, mpirun, srun with PMI) moves CPU tensors over MPI:
the group needs an MPI communicator whose ranks are torch's ranks in the same order, which this
module builds, refusing with a message that says how to launch when torch's rank or world size
disagrees with MPI's. Any other launch (torchrun, ``mp.spawn``, env://, file://, tcp://) moves
them over the gloo engine (denseccl/backends/gloo/transport.py), made from the group's own store.
"""

from __future__ import annotations

import time
from typing import Any, Optional, Sequence, Tuple

import torch.distributed as dist

from ..config import launched_by_mpi
from ..errors import DenseCCLError
from ..backends.store import wait_for_keys


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
            "job; "
            "launch with mpiexec (pip install 'denseccl[mpi]')"
        )
    return "gloo"


def arrive(store: Any, rank: int, size: int, timeout: Optional[float], what: str) -> None:
    """Return once every rank of a group has reached this point (each sets its key on the
    group's store); CollectiveTimeoutError after ``timeout`` seconds. Run before a blocking
    collective setup step, so that a member that never comes cannot hold the others forever."""
    store.set(f"denseccl/arrived/{rank}", b"1")
    deadline = None if timeout is None else time.monotonic() + timeout
    wait_for_keys(store, [f"denseccl/arrived/{r}" for r in range(size)], deadline, what)


def mpi_group(rank: int, size: int, global_ranks: Sequence[int]) -> Tuple[Any, bool]:
    """The mpi4py communicator of a group's ranks, and whether it was created for a subgroup
    (then the group frees it). ``global_ranks`` lists a subgroup's members in group-rank order
    and is empty for the default group (as torch passes it), which is MPI's world: its size
    must be MPI's. A subgroup's members may be any ranks, the first ``k`` included. Raises when
    torch's ranks are not MPI's."""
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
