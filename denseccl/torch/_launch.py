"""The MPI side of a process group's launch.

CPU tensors move over MPI, so a group needs an MPI communicator whose ranks are torch's ranks
in the same order. This module says whether that can exist in this process (started by an
MPI launcher, mpi4py installed) and builds it, refusing with a message that says how to launch
when torch's rank or world size disagrees with MPI's. Without one, CUDA tensors still work.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple

from ..config import launched_by_mpi
from ..errors import DenseCCLError


def host_problem(size: int) -> Optional[str]:
    """Why a group of ``size`` ranks cannot move CPU tensors over MPI in this process, or None
    if it can. Started by an MPI launcher without mpi4py is an error, raised here."""
    if not launched_by_mpi() and size > 1:
        return (
            f"the denseccl backend moves CPU tensors over MPI, but this process was not started by an MPI "
            f"launcher: launch all {size} ranks with mpiexec -n {size} (or launch/run -n {size}) and give "
            "torch the MPI rank (denseccl.torch.init_process_group() does that). CUDA tensors work without "
            "one (their NCCL communicator bootstraps over torch's store)"
        )
    try:
        import mpi4py.MPI  # noqa: F401, PLC0415
    except ImportError as error:
        if launched_by_mpi():
            raise DenseCCLError(f"denseccl: the job was started by mpiexec but mpi4py is missing ({error}): pip install 'denseccl[mpi]'") from None
        return f"the denseccl backend moves CPU tensors over MPI, and mpi4py is not installed ({error}): pip install 'denseccl[mpi]'"
    return None


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
