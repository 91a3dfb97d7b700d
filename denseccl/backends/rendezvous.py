"""How the ranks of a launch meet without MPI: the torchrun-style variables, the env:// store
(one per process, shared by every backend), and the namespace of each communicator on a store.

Why it exists apart from any backend: gloo and NCCL both meet on a torch key-value store, and a
process may hold communicators of both, and a torch process group, on the one store that
torchrun's variables point to. A second ``TCPStore`` server on ``MASTER_ADDR:MASTER_PORT``
would fail to bind, so the store is made once per address and shared, and every communicator
works under a prefix of its own that every rank computes alike (a counter per rank and
backend, kept in the store), so that their keys never collide. Reaching the store is bounded
by the bootstrap's deadline, as every other step of ``init``.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Mapping, Optional, Tuple

from .. import config
from ..errors import CollectiveTimeoutError, DenseCCLError
from ..transport import is_timeout
from .slurm import master_value

#: the variables of a torchrun-style launch (env://)
ENV_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


#: where srun says what RANK and WORLD_SIZE say, for a task of a job step (cluster scripts export
#: MASTER_ADDR and MASTER_PORT and launch with srun, which sets no RANK; the batch script itself
#: has SLURM_PROCID but no SLURM_STEP_NUM_TASKS)
SRUN_VARIABLES = {"RANK": "SLURM_PROCID", "WORLD_SIZE": "SLURM_STEP_NUM_TASKS"}


def _env_value(name: str, source: Mapping[str, str]) -> Optional[str]:
    """``name``'s value, else srun's for it (both of srun's variables must be there; the
    address and port from the step's nodes and ids: backends/slurm.py)."""
    value = master_value(name, source)
    if value or name not in SRUN_VARIABLES:
        return value
    srun = [source.get(variable, "") for variable in SRUN_VARIABLES.values()]
    return source[SRUN_VARIABLES[name]] if all(raw.isdigit() for raw in srun) else None


def env_launch(environ: Optional[Mapping[str, str]] = None) -> bool:
    """Whether this process has a torchrun-style environment (env://), RANK and WORLD_SIZE
    perhaps given by srun (:data:`SRUN_VARIABLES`), MASTER_ADDR and MASTER_PORT perhaps derived
    from the srun step (backends/slurm.py)."""
    source = os.environ if environ is None else environ
    return all(_env_value(name, source) for name in ENV_VARIABLES)


def env_int(name: str, given: Optional[int]) -> int:
    """``given``, else the integer in the environment variable ``name`` (``RANK``, ``WORLD_SIZE``),
    else srun's for it."""
    if given is not None:
        return int(given)
    raw = _env_value(name, os.environ)
    if raw is None:
        raise DenseCCLError(f"pass {name.lower()}= or set {name} (a torchrun-style launch sets it)")
    try:
        return int(raw)
    except ValueError:
        raise DenseCCLError(f"{name} must be an integer, got {raw!r}") from None


_STORES: Dict[Tuple[str, int], Any] = {}


def env_store(rank: int, size: int, timeout: Optional[float]) -> Any:  # timeout: seconds to reach the server
    """The ``TCPStore`` at ``MASTER_ADDR:MASTER_PORT``, made once per process (a second init
    reuses it: its server holds the port), served by rank 0 unless torchrun's agent serves it
    (``TORCHELASTIC_USE_AGENT_STORE=True``). CollectiveTimeoutError when the server cannot be
    reached within ``timeout`` seconds."""
    from ..backends.store import tcp_store  # noqa: PLC0415 - needs torch

    address = (str(_env_value("MASTER_ADDR", os.environ)), int(str(_env_value("MASTER_PORT", os.environ))))
    store = _STORES.get(address)
    if store is None:
        agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
        try:
            store = tcp_store(
                *address, rank, size, is_master=rank == 0 and not agent, timeout=timeout or config.DEFAULT_TIMEOUT
            )
        except RuntimeError as error:  # DistStoreError, DistNetworkError: the server is not there
            if is_timeout(error):
                raise CollectiveTimeoutError(
                    f"denseccl.init could not reach the store at {address[0]}:{address[1]} within the timeout "
                    f"({error}); is rank 0 running, and are MASTER_ADDR and MASTER_PORT the same on every rank?"
                ) from None
            raise
        _STORES[address] = store
    return store


def store_namespace(store: Any, prefix: str, backend: str, rank: int) -> str:
    """``{prefix}/{backend}/{n}`` for the n-th communicator of ``backend`` (from 0) that this
    rank builds on ``store``. The counter is per rank and kept in the store itself, so that
    groups with different members and re-created store objects agree on ``n``."""
    number = int(store.add(f"{prefix}/{backend}/inits/{rank}", 1)) - 1
    return f"{prefix}/{backend}/{number}"


__all__ = ["ENV_VARIABLES", "SRUN_VARIABLES", "env_int", "env_launch", "env_store", "store_namespace"]
