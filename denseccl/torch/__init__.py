"""denseccl for PyTorch.

Importing this package registers the ``"denseccl"`` backend of ``torch.distributed`` for the
devices ``cpu`` (over MPI; launch with ``mpiexec``) and ``cuda`` (over NCCL)::

    import torch.distributed as dist
    import denseccl.torch

    dist.init_process_group("denseccl", init_method="tcp://127.0.0.1:29500", rank=rank, world_size=size)
    # or, in a job started by mpiexec, with rank and world size taken from MPI:
    denseccl.torch.init_process_group()

Every collective then works on tensors of any non-overlapping dense layout (channels-last,
transposed, permuted), results keep the tensors' strides, a gapped tensor is refused, and ranks
whose layouts differ all raise a ``MismatchError`` instead of exchanging garbage.

Also here: the Gradient Layout Contract tools (:func:`grad_layout_violations`,
:func:`enforce_grad_layout`, :func:`restride_grads`) and :class:`DataParallel`.
"""

from __future__ import annotations

import datetime
import os
import socket
from typing import Any, Optional

import torch.distributed as dist

from .data_parallel import DataParallel, broadcast_coalesced, reduce_add_coalesced, replicate
from .grad_layout import GradLayoutHooks, GradLayoutViolation, enforce_grad_layout, grad_layout_violations, restride_grads
from ._launch import launched_by_mpi
from .process_group import BACKEND_NAME, ProcessGroupDenseCCL, create_process_group


def _register() -> None:
    if not hasattr(dist.Backend, BACKEND_NAME.upper()):
        dist.Backend.register_backend(BACKEND_NAME, create_process_group, extended_api=True, devices=["cpu", "cuda"])


_register()


def init_process_group(*, init_method: Optional[str] = None, timeout: Optional[datetime.timedelta] = None, **kwargs: Any) -> None:
    """``torch.distributed.init_process_group("denseccl", ...)`` for a job started by mpiexec:
    rank and world size come from MPI. Without ``init_method``, ``store`` or
    ``MASTER_ADDR``/``MASTER_PORT`` in the environment, rank 0 opens a TCPStore on a free port
    and tells the others over MPI, so nothing needs configuring."""
    from mpi4py import MPI  # noqa: PLC0415

    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    wait = timeout or datetime.timedelta(minutes=5)
    if init_method is None and "store" not in kwargs and not ("MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ):
        hosts = world.allgather(socket.gethostname())
        host = "127.0.0.1" if len(set(hosts)) == 1 else hosts[0]
        store = dist.TCPStore(host, 0, size, is_master=True, timeout=wait, wait_for_workers=False) if rank == 0 else None
        port = world.bcast(store.port if store is not None else None, root=0)
        if store is None:
            store = dist.TCPStore(host, port, size, is_master=False, timeout=wait)
        kwargs["store"] = store
    elif init_method is None and "store" not in kwargs:
        init_method = "env://"
    if timeout is not None:
        kwargs["timeout"] = timeout
    dist.init_process_group(BACKEND_NAME, init_method=init_method, rank=rank, world_size=size, **kwargs)


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
