"""The MPI backend's set-up: the ranks of an MPI launch (mpiexec, mpirun, srun with PMI) or of a
given mpi4py communicator get a transport and a control channel (the bootstrap builds the
Communicator on them).

Why apart from the transport: making a communicator is the one step where a rank cannot yet
know whether its peers are alive, so it is bounded by the timeout like every later call. The
job's communicator is duplicated twice with the nonblocking ``MPI_Comm_idup``, waited for by the
one wait loop (wait.py), so that a peer that never calls ``init`` makes the others raise
CollectiveTimeoutError instead of hanging in ``MPI_Comm_dup``. The first duplicate carries the
data (transport.py), the second the agreement step and the "gave up" notes (control.py), so that
an agreement never queues behind a large transfer and the control channel's own tags cannot
match data messages.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Mapping, Optional, Tuple

from ... import config, log
from ...channel.base import ControlChannel
from ...errors import CollectiveTimeoutError, DenseCCLError
from ...transport import Transport
from ...wait import wait_until
from ..rendezvous import SRUN_VARIABLES
from ..slurm import srun_mpi_option


def import_mpi(what: str = "the mpi backend") -> Any:
    """mpi4py's ``MPI``, or :class:`DenseCCLError` with how to install it. mpi4py's ABI wheels
    load the MPI library when ``mpi4py.MPI`` is imported and raise RuntimeError ("cannot load MPI
    library", one line per path tried) when there is none: that is a missing install too."""
    try:
        from mpi4py import MPI  # noqa: PLC0415 - optional dependency
    except (ImportError, RuntimeError) as error:
        raise DenseCCLError(
            f"{what} needs mpi4py and an MPI library ({mpi_load_failure(error)}); install them with "
            "pip install 'denseccl[mpi]' (mpi4py and mpich) and launch the job with mpiexec"
        ) from None
    return MPI


def mpi_load_failure(error: BaseException) -> str:
    """Why ``from mpi4py import MPI`` failed, on one line (mpi4py lists each library path it tried)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {'; '.join(lines) or 'no message'}"


def init_mpi(comm: Any, deadline: Optional[float]) -> Tuple[Transport, ControlChannel]:
    """A transport and a control channel over two duplicates of ``comm`` (default ``COMM_WORLD``):
    one for the data, one for the agreement step."""
    MPI = import_mpi()
    from ...transport import abandon  # noqa: PLC0415
    from .transport import MPITransport, open_control  # noqa: PLC0415

    base = comm if comm is not None else MPI.COMM_WORLD
    if comm is None:
        refuse_singleton(base.Get_size(), library=str(MPI.Get_library_version()))
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
    return MPITransport(duplicates[0]), open_control(duplicates[1])


def refuse_singleton(world: int, environ: Optional[Mapping[str, str]] = None, library: str = "") -> None:
    """Refuse an MPI world smaller than the launcher's job: srun without PMI (or a launcher
    MPI does not know) starts every task as an MPI singleton, a world of one, where every
    collective would return the rank's own input. The message names the srun option that
    ``library`` (MPI's version string) understands."""
    source = os.environ if environ is None else environ
    for variable in ("WORLD_SIZE", SRUN_VARIABLES["WORLD_SIZE"]):
        raw = source.get(variable, "")
        if raw.isdigit() and int(raw) > world:
            raise DenseCCLError(
                f"MPI's world has {world} rank(s) but {variable}={raw}: this process was not started by an MPI "
                "launcher that MPI understands (srun without --mpi=pmi2/pmix starts each task as an MPI world of "
                f"its own). Launch with mpiexec or {srun_mpi_option(library)}, or use the gloo engine "
                "(backend='gloo', needs torch), which forms an srun step from Slurm's variables, or from MASTER_ADDR "
                "and MASTER_PORT"
            )


def _log_mpi(MPI: Any, base: Any) -> None:
    """``DENSECCL_DEBUG=INFO``: this rank's place in the job and the kernels it reduces with."""
    if not log.logger.isEnabledFor(logging.INFO):
        return
    import mpi4py  # noqa: PLC0415

    from . import host_kernels  # noqa: PLC0415

    log.set_rank(MPI.COMM_WORLD.Get_rank())
    library = " ".join(str(MPI.Get_library_version()).splitlines()[0].split())
    which = "the world" if base == MPI.COMM_WORLD else "a given"
    log.info("init: mpi: rank %d of %d on host %s, %s communicator, %s, mpi4py %s", base.Get_rank(), base.Get_size(),
             MPI.Get_processor_name(), which, library, mpi4py.__version__)
    log.info("init: float16/bfloat16 reductions on %s kernels (DENSECCL_HOST_KERNELS=%s)",
             "the compiled" if host_kernels.native_available() else "torch's or NumPy's (compiled ones not built)",
             config.settings().host_kernels)


__all__ = ["import_mpi", "init_mpi", "mpi_load_failure"]
