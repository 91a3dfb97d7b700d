"""Who am I: build a Communicator from the environment (mpiexec/mpirun), or from explicit
arguments.

Policy knobs, each with an environment twin: ``backend`` (``DENSECCL_BACKEND``), ``check``
(``DENSECCL_CHECK=always|off``), ``timeout`` in seconds (``DENSECCL_TIMEOUT``; 0 waits forever),
``on_timeout`` (``DENSECCL_ON_TIMEOUT=raise|abort``).
"""

from __future__ import annotations

import logging
import os
from typing import Any, Optional, Union

from . import config, log
from .communicator import Communicator
from .errors import DenseCCLError



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

    ``backend``: ``"mpi"`` (host arrays over mpi4py), ``"nccl"`` (device arrays over NCCL) or
    None to choose: ``DENSECCL_BACKEND`` if set, else NCCL where a GPU and NCCL are present and
    MPI otherwise. ``comm``: an mpi4py communicator to build on (default ``MPI.COMM_WORLD``;
    under mpiexec nothing else is needed). ``check``: ``"always"`` (default) checks that every
    rank holds the same descriptor before each collective; ``"off"`` skips that, and then a rank
    whose input is invalid raises alone while its peers wait until the timeout. ``timeout``:
    seconds (or a ``datetime.timedelta``) a rank waits for its peers before
    :class:`CollectiveTimeoutError` (default ``DENSECCL_TIMEOUT``, else 300; 0 waits forever).
    ``on_timeout``: ``"raise"`` (default ``DENSECCL_ON_TIMEOUT``, else raise) raises that error
    and tells the peers, whose current or next call then raises
    :class:`CommunicatorBrokenError`; ``"abort"`` ends the whole job instead (docs/faults.md).
    """
    given = backend
    backend = (backend or config.settings().backend or _default_backend()).lower()
    checking = _check_policy(check)
    seconds = config.timeout(timeout)
    policy = config.on_timeout(on_timeout)
    _log_decisions(given, backend, check, checking, seconds)
    if backend == "mpi":
        if options:
            raise DenseCCLError(f"unexpected options for the mpi backend: {', '.join(options)}")
        return _init_mpi(comm, checking, seconds, policy)
    if backend == "nccl":
        from .nccl_bootstrap import init_nccl  # noqa: PLC0415 - needs cupy

        communicator = init_nccl(comm=comm, check=checking, timeout=seconds, **options)
        communicator.flow.on_timeout = policy
        return communicator
    raise DenseCCLError(f"unknown backend {backend!r}: use 'mpi' (host arrays) or 'nccl' (device arrays)")


def _init_mpi(comm: Any, check: bool, timeout: Optional[float], on_timeout: str) -> Communicator:
    MPI = _import_mpi()
    from .transports.mpi import MPITransport, open_control  # noqa: PLC0415

    base = comm if comm is not None else MPI.COMM_WORLD
    _log_mpi(MPI, base)
    transport = MPITransport(base.Dup())
    return Communicator(transport, open_control(base.Dup()), check=check, timeout=timeout, on_timeout=on_timeout)


def _default_backend() -> str:
    """NCCL when a GPU and NCCL are usable here, else MPI."""
    try:
        from .nccl_bootstrap import nccl_usable  # noqa: PLC0415
    except ImportError:
        return "mpi"
    return "nccl" if nccl_usable() else "mpi"


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


def _log_mpi(MPI: Any, base: Any) -> None:  # noqa: N803 - the module's own name
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
