"""The NCCL backend's set-up: who this rank is, and what NCCL here can do, before any device work.

Why it exists: everything the NCCL path knows before a communicator runs is answered here, by
functions and data that the CPU tests check without a GPU, so that the transport
(:mod:`.transport`) stays one NCCL call per collective.

- Can NCCL run here (:func:`nccl_missing`: CuPy, a visible GPU, a libnccl CuPy can load), and
  if not, how to fix it.
- :func:`init_nccl`: how the ranks meet (:func:`launch_kind`: ``store=``, ``comm=``, a
  torchrun-style environment, MPI's ``COMM_WORLD`` or one rank; docs/nccl.md), which GPU each
  drives (:func:`pick_device`), and rank 0's unique id sent to the others in CuPy's form.
- What NCCL of each version can do is :mod:`.tables`' (which the transport reads too); the
  calls CuPy lacks are :mod:`.library`'s.
"""
from __future__ import annotations

import importlib
import sys
import warnings
from typing import Any, Optional, Tuple

from ... import config
from ...channel.base import ControlChannel
from ...errors import DenseCCLError
from ...transport import Transport
from ..mpi.init import mpi_load_failure, refuse_singleton
from ..rendezvous import env_int, env_launch, env_store, store_namespace
from .advice import install_hint, nccl_wheel
from .placement import check_one_rank_per_device, device_identity
from .tables import NCCL_IN_PROGRESS, in_progress_error, nccl_status, result_name

UNIQUE_ID_BYTES = 128

# -- is NCCL usable here? -------------------------------------------------------------------------


def nccl_missing() -> Optional[str]:
    """What keeps the nccl backend from running here, with how to fix it; None if nothing."""
    try:
        import cupy  # noqa: PLC0415 - optional dependency
    except ImportError as error:
        return (
            f"the nccl backend needs CuPy, which is not installed ({error}). Install CuPy and NCCL with "
            f"{install_hint()}; for host arrays use denseccl.init(backend='mpi')"
        )
    except Exception as error:  # noqa: BLE001 - a broken CUDA install can fail in many ways
        return (
            f"the nccl backend needs CuPy, which failed to import ({type(error).__name__}: {error}); "
            f"reinstall it with {install_hint()}"
        )
    problems = []
    try:
        gpu = bool(cupy.is_available())
    except Exception:  # noqa: BLE001
        gpu = False
    if not gpu:
        problems.append(
            "no CUDA GPU is visible (cupy.is_available() is False: this machine has no GPU or driver, or "
            "CUDA_VISIBLE_DEVICES hides them)"
        )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # CuPy warns when libnccl is missing; we say it better below
        try:
            from cupy.cuda import nccl  # noqa: PLC0415

            has_nccl = bool(getattr(nccl, "available", False))
        except Exception:  # noqa: BLE001
            has_nccl = False
    if not has_nccl:
        problems.append(_nccl_load_problem())
    if not problems:
        return None
    return (
        "the nccl backend cannot run here: "
        + "; and ".join(problems)
        + f". Install the GPU stack with {install_hint()}; for host arrays use denseccl.init(backend='mpi')"
    )


def _nccl_load_problem() -> str:
    """Why CuPy's NCCL extension (``cupy_backends.cuda.libs.nccl``) does not load, as advice:
    no libnccl at all, or one too old for the symbols this CuPy was built against."""
    try:
        importlib.import_module("cupy_backends.cuda.libs.nccl")
        error = None
    except Exception as failure:  # noqa: BLE001 - ImportError or OSError from the dynamic linker
        error = f"{type(failure).__name__}: {failure}"
    if error is not None and "undefined symbol" in error:
        return (
            f"CuPy's NCCL extension cannot use the libnccl it loaded ({error}): that NCCL is older than this CuPy "
            f"needs. Install a newer one (pip install -U {nccl_wheel()}), or put "
            "a newer libnccl.so.2 ahead of the old one (LD_LIBRARY_PATH, a system NCCL or a torch wheel's can shadow "
            "the one the denseccl[cuda12] or [cuda13] extra installs)"
        )
    if error is not None and "libnccl" not in error:
        return f"CuPy's NCCL extension failed to load ({error}); reinstall CuPy and NCCL with {install_hint()}"
    return (
        "CuPy cannot load the NCCL library libnccl.so.2 (cupy.cuda.nccl.available is False"
        + (f": {error}" if error else "")
        + f"): install it with pip install {nccl_wheel()}, which the denseccl[cuda12] and [cuda13] extras include"
    )


def nccl_usable() -> bool:
    """True when CuPy sees a GPU and can load NCCL (what ``denseccl.init()`` uses to choose)."""
    return nccl_missing() is None


def _require_nccl() -> Tuple[Any, Any]:
    problem = nccl_missing()
    if problem is not None:
        raise DenseCCLError(problem)
    import cupy  # noqa: PLC0415
    from cupy.cuda import nccl  # noqa: PLC0415

    return cupy, nccl


# -- the unique id, the device, the launch -------------------------------------------------------


def unique_id_bytes(unique_id: Any) -> bytes:
    """NCCL's 128-byte unique id as bytes, from CuPy 14's ``bytes`` or CuPy 13's tuple of
    (signed) ints."""
    if isinstance(unique_id, (bytes, bytearray, memoryview)):
        raw = bytes(unique_id)
    else:
        try:
            raw = bytes(int(value) & 0xFF for value in unique_id)
        except (TypeError, ValueError):
            raise DenseCCLError(f"not an NCCL unique id: {type(unique_id).__name__}") from None
    if len(raw) != UNIQUE_ID_BYTES:
        raise DenseCCLError(f"an NCCL unique id has {UNIQUE_ID_BYTES} bytes, got {len(raw)}")
    return raw


def unique_id_tuple(raw: bytes) -> Tuple[int, ...]:
    """CuPy 13's form: a tuple of signed chars."""
    return tuple(value - 256 if value > 127 else value for value in raw)


def cupy_wants_bytes(version: str) -> bool:
    """CuPy >= 14 takes (and ``get_unique_id`` returns) the unique id as bytes; earlier
    versions as a tuple of signed ints."""
    try:
        return int(version.split(".")[0]) >= 14
    except ValueError:
        return True


def make_communicator(factory: Any, size: int, raw: bytes, rank: int, cupy_version: str) -> Any:
    """``factory(size, unique_id, rank)`` with the id in the form this CuPy takes. A
    non-blocking communicator (ncclInProgress, which CuPy cannot name) is refused clearly; any
    other NCCL error becomes a :class:`DenseCCLError` that says where to look."""
    try:
        return factory(size, raw if cupy_wants_bytes(cupy_version) else unique_id_tuple(raw), rank)
    except Exception as error:
        status = nccl_status(error)
        if status == NCCL_IN_PROGRESS:
            raise in_progress_error("ncclCommInitRank") from None
        if status is None:
            raise
        raise DenseCCLError(
            f"NCCL could not make the communicator of rank {rank} of {size} (ncclCommInitRank: {result_name(status)}, "
            f"{error}). NCCL_DEBUG=WARN prints NCCL's reason; {INIT_ADVICE.get(status, GENERIC_INIT_ADVICE)}"
        ) from error


GENERIC_INIT_ADVICE = "every rank must run the same NCCL and reach the others (NCCL_SOCKET_IFNAME names the interface)"
INIT_ADVICE = {
    5: "ncclInvalidUsage at init is most often two ranks of one host on one GPU: start one rank per GPU",
    2: "ncclSystemError at init is most often a network NCCL cannot use: set NCCL_SOCKET_IFNAME (lo on one host)",
}


def pick_device(local_rank: Optional[int], rank: int, count: int) -> int:
    """The local rank (else the global rank) modulo the number of visible devices."""
    if count < 1:
        raise DenseCCLError("no CUDA device is visible (check CUDA_VISIBLE_DEVICES)")
    return (local_rank if local_rank is not None else rank) % count


def _use_device(cupy: Any, device: int) -> None:
    cupy.cuda.Device(device).use()
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_available():
                torch.cuda.set_device(device)
        except Exception:  # noqa: BLE001 - torch is only a guest here
            pass


def launch_kind(*, comm: Any = None, store: Any = None, size: Optional[int] = None, environ: Any = None) -> str:
    """``"store"``, ``"mpi"``, ``"env"`` (torchrun-style) or ``"solo"``: how ranks meet."""
    if store is not None:
        return "store"
    if comm is not None:
        return "mpi"
    if size == 1:
        return "solo"
    if env_launch(environ):
        return "env"
    if size is not None:
        raise DenseCCLError(
            f"size={size} needs a way for the ranks to meet: store= (a TCPStore), comm= (mpi4py), a torchrun-style "
            "environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) or mpiexec"
        )
    return "mpi"


def _mpi_world() -> Any:
    """MPI's COMM_WORLD, or None when there is no MPI and no launcher of many ranks (a single
    rank). A launcher's world size above one without MPI is refused, never made a world of one."""
    try:
        from mpi4py import MPI  # noqa: PLC0415
    except Exception as error:  # noqa: BLE001 - ImportError, or RuntimeError: no MPI library behind mpi4py
        if config.launched_by_mpi():
            raise DenseCCLError(
                f"this looks like an MPI launch, but mpi4py cannot start ({mpi_load_failure(error)}); install "
                "it with pip install 'denseccl[mpi]', or launch with torchrun-style variables"
            ) from None
        refuse_singleton(1)
        return None
    return MPI.COMM_WORLD


def init_nccl(
    comm: Any,
    timeout: Optional[float],
    deadline: Optional[float],
    *,
    store: Any = None,
    rank: Optional[int] = None,
    size: Optional[int] = None,
    device: Optional[int] = None,
    prefix: str = "denseccl",
) -> Tuple[Transport, ControlChannel]:
    """A transport and a control channel over NCCL (launches and devices: docs/nccl.md); the
    store's unique id exchange and the first barrier are bounded by ``deadline``."""
    cupy, nccl = _require_nccl()
    from ..store import SoloControl, open_store_control, wait_for_keys  # noqa: PLC0415
    from .transport import NCCLTransport  # noqa: PLC0415

    kind = launch_kind(comm=comm, store=store, size=size)
    if kind == "mpi":
        comm = comm if comm is not None else _mpi_world()
        kind = "solo" if comm is None else kind
    count = cupy.cuda.runtime.getDeviceCount()
    control: Any
    if kind == "mpi":
        from mpi4py import MPI  # noqa: PLC0415

        from ..mpi.control import open_control  # noqa: PLC0415

        rank, size = comm.Get_rank(), comm.Get_size()
        if device is None:
            node = comm.Split_type(MPI.COMM_TYPE_SHARED)
            try:
                device = pick_device(node.Get_rank(), rank, count)
            finally:
                node.Free()
        _use_device(cupy, device)
        raw = comm.bcast(unique_id_bytes(nccl.get_unique_id()) if rank == 0 else None, root=0)
        control = open_control(comm.Dup())
    else:
        rank, size = (0, 1) if kind == "solo" else (env_int("RANK", rank), env_int("WORLD_SIZE", size))
        if kind == "env":
            store = env_store(rank, size, timeout)
        device = device if device is not None else pick_device(config.local_rank(), rank, count)
        _use_device(cupy, device)
        if kind == "solo":
            raw = unique_id_bytes(nccl.get_unique_id())
            control = SoloControl()
        else:
            namespace = store_namespace(store, prefix, "nccl", rank)
            key = f"{namespace}/unique_id"
            if rank == 0:
                store.set(key, unique_id_bytes(nccl.get_unique_id()))
            wait_for_keys(store, [key], deadline, "the NCCL unique id exchange")
            raw = unique_id_bytes(store.get(key))
            control = open_store_control(store, rank, size, f"{namespace}/control", deadline)

    try:
        check_one_rank_per_device(control, device_identity(cupy, device), deadline)  # before NCCL refuses it
        with cupy.cuda.Device(device):
            nccl_comm = make_communicator(nccl.NcclCommunicator, size, raw, rank, cupy.__version__)
    except BaseException:
        control.close()
        raise
    transport = NCCLTransport(nccl_comm, device, timeout=timeout, version=nccl.get_version())
    try:
        transport.barrier().synchronize(deadline)  # fail early, in the constructor (vLLM does the same)
    except BaseException:
        transport.close()
        control.close()
        raise
    return transport, control


__all__ = [
    "cupy_wants_bytes", "init_nccl", "launch_kind", "make_communicator", "nccl_missing", "nccl_usable", "pick_device",
    "unique_id_bytes", "unique_id_tuple",
]
