"""denseccl for PyTorch (docs/torch.md).

Importing this package registers the ``"denseccl"`` backend of ``torch.distributed`` for
``cpu`` and ``cuda`` tensors of any non-overlapping dense layout (:mod:`.process_group`). Also
here: the Gradient Layout Contract tools (:func:`grad_layout_violations`,
:func:`enforce_grad_layout`, :func:`restride_grads`) and :class:`DataParallel`.
"""

from __future__ import annotations

import datetime
from typing import Any, Optional

import torch.distributed as dist

from .. import config
from ..backends.mpi.init import import_mpi
from . import _launch

from .data_parallel import DataParallel, broadcast_coalesced, reduce_add_coalesced, replicate
from .grad_layout import (
    GradLayoutHooks,
    GradLayoutViolation,
    enforce_grad_layout,
    grad_layout_violations,
    restride_grads,
)
from ._launch import launched_by_mpi, needs_mpi_rendezvous
from .process_group import BACKEND_NAME, ProcessGroupDenseCCL, create_process_group


if not hasattr(dist.Backend, BACKEND_NAME.upper()):
    dist.Backend.register_backend(BACKEND_NAME, create_process_group, extended_api=True, devices=["cpu", "cuda"])
_launch.register()


def init_process_group(
    backend: Optional[str] = BACKEND_NAME,
    init_method: Optional[str] = None,
    timeout: config.Seconds = None,
    world_size: int = -1,
    rank: int = -1,
    store: Any = None,
    **kwargs: Any,
) -> None:
    """``torch.distributed.init_process_group`` with its arguments (``backend`` first, default
    ``"denseccl"``), for every launch. Under an MPI launcher (mpiexec, mpirun, srun), rank and
    world size come from MPI, and without ``init_method``, ``store`` or
    ``MASTER_ADDR``/``MASTER_PORT``, rank 0 opens a TCPStore on a free port and tells the others
    over MPI, so nothing needs configuring. Elsewhere (torchrun, spawn) it is torch's own call.
    ``timeout``: a ``datetime.timedelta`` or seconds; every step of the bootstrap honours it."""
    seconds = config.seconds(timeout, "timeout")
    if seconds is not None:
        kwargs["timeout"] = datetime.timedelta(seconds=seconds)
    if launched_by_mpi():
        if init_method is None and store is None and needs_mpi_rendezvous():
            init_method = f"{_launch.SCHEME}://"
        if rank == -1 or world_size == -1:
            MPI = import_mpi("denseccl.torch.init_process_group under an MPI launcher")
            rank = MPI.COMM_WORLD.Get_rank() if rank == -1 else rank
            world_size = MPI.COMM_WORLD.Get_size() if world_size == -1 else world_size
        if init_method == f"{_launch.SCHEME}://":
            rank = world_size = -1  # the rendezvous says (and checks) them
    dist.init_process_group(backend, init_method=init_method, world_size=world_size, rank=rank, store=store, **kwargs)


__all__ = [
    "BACKEND_NAME",
    "DataParallel",
    "GradLayoutHooks",
    "GradLayoutViolation",
    "ProcessGroupDenseCCL",
    "broadcast_coalesced",
    "enforce_grad_layout",
    "grad_layout_violations",
    "init_process_group",
    "launched_by_mpi",
    "reduce_add_coalesced",
    "replicate",
    "restride_grads",
]
