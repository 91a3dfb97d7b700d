"""Who am I: build a Communicator from the environment (mpiexec/mpirun, torchrun), or from
explicit arguments.

Launches, for host arrays: an MPI launcher (mpiexec, mpirun, srun with PMI) gives the MPI
transport; a torchrun-style environment (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT``) without one gives the gloo engine (transports/gloo.py) over a ``TCPStore`` at
``MASTER_ADDR:MASTER_PORT``, where torch is installed; ``store=`` with ``rank=`` and ``size=``
gives the gloo engine on that store. Every step of the bootstrap honours ``timeout``: a peer
that never calls ``init`` makes it raise :class:`CollectiveTimeoutError` on the others.

Policy knobs, each with an environment twin: ``backend`` (``DENSECCL_BACKEND``), ``check``
(``DENSECCL_CHECK=always|off``), ``timeout`` in seconds (``DENSECCL_TIMEOUT``; 0 waits forever),
``on_timeout`` (``DENSECCL_ON_TIMEOUT=raise|abort``).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Dict, Optional, Tuple, Union

from . import config, log
from .communicator import Communicator
from .errors import CollectiveTimeoutError, DenseCCLError

#: the variables of a torchrun-style launch (env://)
ENV_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _check_policy(check: Union[None, bool, str]) -> bool:
    return config.settings().check if check is None else config.flag(check, "check")


def _import_mpi() -> Any:
    try:
        from mpi4py import MPI  # noqa: PLC0415 - optional dependency
    except ImportError as error:
        raise DenseCCLError(
            f"the mpi backend needs mpi4py and an MPI library ({error}); install them with "
            "pip install 'denseccl[mpi]' (mpi4py and mpich) and launch the job with mpiexec"
        ) from None
    return MPI


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
    deadline = _deadline(seconds)  # one deadline for every bootstrap step, choosing the backend included
    given = backend
    backend = (backend or config.settings().backend or _default_backend(options)).lower()
    checking = _check_policy(check)
    _log_decisions(given, backend, check, checking, seconds)
    if backend == "mpi":
        if options:
            raise DenseCCLError(f"unexpected options for the mpi backend: {', '.join(options)}")
        return _init_mpi(comm, checking, seconds, deadline, policy)
    if backend == "gloo":
        communicator = _init_gloo(checking, seconds, deadline, **options)
        communicator.flow.on_timeout = policy
        return communicator
    if backend == "nccl":
        from .nccl_bootstrap import init_nccl  # noqa: PLC0415 - needs cupy

        communicator = init_nccl(comm=comm, check=checking, timeout=seconds, **options)
        communicator.flow.on_timeout = policy
        return communicator
    raise DenseCCLError(
        f"unknown backend {backend!r}: use 'mpi' or 'gloo' (host arrays) or 'nccl' (device arrays)"
    )


def _deadline(timeout: Optional[float]) -> Optional[float]:
    return None if timeout is None else time.monotonic() + timeout


def _init_mpi(
    comm: Any, check: bool, timeout: Optional[float], deadline: Optional[float], on_timeout: str
) -> Communicator:
    MPI = _import_mpi()
    from .transports.base import abandon, wait_until  # noqa: PLC0415
    from .transports.mpi import MPITransport, open_control  # noqa: PLC0415

    base = comm if comm is not None else MPI.COMM_WORLD
    _log_mpi(MPI, base)
    duplicates = []
    for _ in range(2):  # nonblocking, so that a peer that never calls init cannot hold this rank forever
        duplicate, request = base.Idup()
        try:
            wait_until(request.Test, deadline, "denseccl.init (MPI_Comm_idup: every rank must call init)")
        except CollectiveTimeoutError:
            abandon(duplicate, request)
            raise
        duplicates.append(duplicate)
    # every rank has arrived: the control channel's own collective setup completes
    transport = MPITransport(duplicates[0])
    return Communicator(transport, open_control(duplicates[1]), check=check, timeout=timeout, on_timeout=on_timeout)


def env_launch(environ: Any = None) -> bool:
    """Whether this process has a torchrun-style environment (env://)."""
    source = os.environ if environ is None else environ
    return all(source.get(name) for name in ENV_VARIABLES)


def _env_int(name: str, given: Optional[int]) -> int:
    if given is not None:
        return int(given)
    raw = os.environ.get(name)
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
    from .transports.store import tcp_store  # noqa: PLC0415

    address = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
    store = _STORES.get(address)
    if store is None:
        agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
        try:
            store = tcp_store(*address, rank, size, is_master=rank == 0 and not agent, timeout=timeout or 300.0)
        except RuntimeError as error:  # DistStoreError, DistNetworkError: the server is not there
            if "timeout" in str(error).lower() or "timed out" in str(error).lower():
                raise CollectiveTimeoutError(
                    f"denseccl.init could not reach the store at {address[0]}:{address[1]} within the timeout "
                    f"({error}); is rank 0 running, and are MASTER_ADDR and MASTER_PORT the same on every rank?"
                ) from None
            raise
        _STORES[address] = store
    return store


def _init_gloo(
    check: bool,
    timeout: Optional[float],
    deadline: Optional[float],
    *,
    store: Any = None,
    rank: Optional[int] = None,
    size: Optional[int] = None,
    prefix: str = "denseccl",
    **unexpected: Any,
) -> Communicator:
    """The gloo engine on ``store`` (default: the env:// store of a torchrun-style launch)."""
    if unexpected:
        raise DenseCCLError(
            f"unexpected options for the gloo backend: {', '.join(sorted(unexpected))} "
            "(known: store, rank, size, prefix)"
        )
    try:
        from .transports.gloo import open_gloo  # noqa: PLC0415 - needs torch
    except ImportError as error:
        raise DenseCCLError(
            f"the gloo engine needs torch ({error}): install torch, or launch with mpiexec for the MPI transport "
            "(pip install 'denseccl[mpi]')"
        ) from None
    rank, size = _env_int("RANK", rank), _env_int("WORLD_SIZE", size)
    if store is None:
        if not env_launch():
            raise DenseCCLError(
                "the gloo backend needs a way for the ranks to meet: store= (a torch TCPStore or FileStore) with rank= "
                "and size=, or a torchrun-style environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)"
            )
        store = env_store(rank, size, None if deadline is None else max(deadline - time.monotonic(), 0.001))
    # the n-th communicator this rank builds on this store (a per-rank counter kept in the store,
    # so that groups with different members and re-created store objects agree)
    number = int(store.add(f"{prefix}/gloo/inits/{rank}", 1)) - 1
    transport, control = open_gloo(store, rank, size, timeout, f"{prefix}/gloo/{number}/", deadline)
    return Communicator(transport, control, check=check, timeout=timeout)


def _default_backend(options: Any = None) -> str:
    """NCCL when a GPU and NCCL are usable here; else gloo under a launch that is not MPI's
    (torchrun-style variables, or a store given) where torch is installed; else MPI."""
    try:
        from .nccl_bootstrap import nccl_usable  # noqa: PLC0415
    except ImportError:
        usable = False
    else:
        usable = nccl_usable()
    if usable:
        return "nccl"
    if (options and options.get("store") is not None) or (env_launch() and not config.launched_by_mpi()):
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
        try:
            from .nccl_bootstrap import nccl_missing  # noqa: PLC0415

            source += f" (not nccl: {nccl_missing()})"
        except ImportError:
            pass
    log.info("init: backend %s, from %s", backend, source)
    log.info("init: agreement check %s (from %s), timeout %s", "always" if checking else "off",
             "the argument" if check is not None else "DENSECCL_CHECK or the default",
             "none" if seconds is None else f"{seconds:g} s")


def _log_mpi(MPI: Any, base: Any) -> None:
    if not log.logger.isEnabledFor(logging.INFO):
        return
    import mpi4py  # noqa: PLC0415

    from .transports import host_kernels  # noqa: PLC0415

    log.set_rank(MPI.COMM_WORLD.Get_rank())
    library = " ".join(str(MPI.Get_library_version()).splitlines()[0].split())
    which = "the world" if base == MPI.COMM_WORLD else "a given"
    log.info("init: mpi: rank %d of %d on host %s, %s communicator, %s, mpi4py %s", base.Get_rank(), base.Get_size(),
             MPI.Get_processor_name(), which, library, mpi4py.__version__)
    log.info("init: float16/bfloat16 reductions on %s kernels (DENSECCL_HOST_KERNELS=%s)",
             "the compiled" if host_kernels.native_available() else "torch's or NumPy's (compiled ones not built)",
             config.settings().host_kernels)
