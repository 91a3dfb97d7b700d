"""The gloo backend's set-up: ranks that meet on a torch key-value store get a transport and a
control channel (the bootstrap builds the Communicator on them).

Why: a launch without MPI (torchrun, ``torch.multiprocessing.spawn``, env://) has no
communicator to start from, only a store every rank can reach (``store=``, or the env:// store
of the process, backends/rendezvous.py). This finds the rank and size (arguments first, then
``RANK`` / ``WORLD_SIZE``), the store, and a namespace on it of this communicator's own, so
that several communicators, or a torch process group, can share one store; then it makes the
two gloo groups, bounded by the bootstrap's deadline. A missing torch is a DenseCCLError that
says what to install.
"""

from __future__ import annotations

import time
from typing import Any, Optional, Tuple

from ...channel.base import ControlChannel
from ...errors import DenseCCLError
from ...transport import Transport
from ..rendezvous import env_int, env_launch, env_store, store_namespace


def init_gloo(
    timeout: Optional[float],
    deadline: Optional[float],
    *,
    store: Any = None,
    rank: Optional[int] = None,
    size: Optional[int] = None,
    prefix: str = "denseccl",
) -> Tuple[Transport, ControlChannel]:
    """The gloo engine's transport and control channel on ``store`` (default: the env:// store of a
    torchrun-style launch)."""
    try:
        from .transport import open_gloo  # noqa: PLC0415 - needs torch
    except ImportError as error:
        raise DenseCCLError(
            f"the gloo engine needs torch ({error}): install torch, or launch with mpiexec for the MPI transport "
            "(pip install 'denseccl[mpi]')"
        ) from None
    rank, size = env_int("RANK", rank), env_int("WORLD_SIZE", size)
    if store is None:
        if not env_launch():
            raise DenseCCLError(
                "the gloo backend needs a way for the ranks to meet: store= (a torch TCPStore or FileStore) with rank= "
                "and size=, or a torchrun-style environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)"
            )
        store = env_store(rank, size, None if deadline is None else max(deadline - time.monotonic(), 0.001))
    namespace = store_namespace(store, prefix, "gloo", rank)
    return open_gloo(store, rank, size, timeout, f"{namespace}/", deadline)


__all__ = ["init_gloo"]
