"""The NCCL backend's init: who this rank is, and what NCCL here can do, before any device work.

Why it exists: everything the NCCL path knows before a communicator runs is answered here, by
functions and data that the CPU tests check without a GPU, so that the transport
(:mod:`.transport`) stays one NCCL call per collective.

- Can NCCL run here (:func:`nccl_missing`: CuPy, a visible GPU, a libnccl CuPy can load), and
  if not, how to fix it.
- :func:`init_nccl`: how the ranks meet (:func:`launch_kind`: ``store=``, ``comm=``, a
  torchrun-style environment, MPI's ``COMM_WORLD`` or one rank; docs/nccl.md), which GPU each
  drives (:func:`pick_device`), and rank 0's unique id sent to the others in CuPy's form.
- What NCCL of each version can do: ``ncclDataType_t`` / ``ncclRedOp_t`` tables, version gates,
  how a dtype and op map onto them (:func:`elements`, :func:`builtin_op`, :func:`check_op`)
  and a PreMulSum factor's bytes (:func:`premul_scalar`).
- The libnccl calls CuPy does not wrap (PreMulSum create/destroy, error strings), declared as
  data (:data:`FUNCTIONS`) and bound through ctypes once per library path by
  :class:`NCCLLibrary` (vLLM's pynccl pattern). Everything else goes through CuPy.
"""
from __future__ import annotations

import ctypes
import functools
import importlib
import math
import sys
import warnings
from typing import Any, ClassVar, Dict, List, NamedTuple, Optional, Tuple

import numpy as np

from ... import config
from ...communicator import Communicator
from ...dtypes import DTYPES, DType
from ...errors import ArgumentError, DenseCCLError, OpError
from ...ops import Op, PreMulSum, ReduceOp, op_kind, reduction_kind
from ..rendezvous import env_int, env_launch, env_store, store_namespace

INSTALL_HINT = "pip install 'denseccl[cuda12]' (CuPy and NCCL for CUDA 12; 'denseccl[cuda13]' for CUDA 13)"
UNIQUE_ID_BYTES = 128

# -- is NCCL usable here? -------------------------------------------------------------------------


def nccl_missing() -> Optional[str]:
    """What keeps the nccl backend from running here, with how to fix it; None if nothing."""
    try:
        import cupy  # noqa: PLC0415 - optional dependency
    except ImportError as error:
        return (
            f"the nccl backend needs CuPy, which is not installed ({error}). Install CuPy and NCCL with "
            f"{INSTALL_HINT}; for host arrays use denseccl.init(backend='mpi')"
        )
    except Exception as error:  # noqa: BLE001 - a broken CUDA install can fail in many ways
        return (
            f"the nccl backend needs CuPy, which failed to import ({type(error).__name__}: {error}); "
            f"reinstall it with {INSTALL_HINT}"
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
        + f". Install the GPU stack with {INSTALL_HINT}; for host arrays use denseccl.init(backend='mpi')"
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
            "needs. Install a newer one (pip install -U nvidia-nccl-cu12, or nvidia-nccl-cu13 for CUDA 13), or put "
            "a newer libnccl.so.2 ahead of the old one (LD_LIBRARY_PATH, a system NCCL or a torch wheel's can shadow "
            "the one denseccl[cuda12] installs)"
        )
    if error is not None and "libnccl" not in error:
        return f"CuPy's NCCL extension failed to load ({error}); reinstall CuPy and NCCL with {INSTALL_HINT}"
    return (
        "CuPy cannot load the NCCL library libnccl.so.2 (cupy.cuda.nccl.available is False"
        + (f": {error}" if error else "")
        + "): install it with pip install nvidia-nccl-cu12 (or nvidia-nccl-cu13 for CUDA 13), which "
        "denseccl[cuda12] includes"
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


# -- versions and tables --------------------------------------------------------------------------


def version_code(major: int, minor: int, patch: int = 0) -> int:
    """NCCL's ``NCCL_VERSION(X, Y, Z)``: ``X*1000 + Y*100 + Z`` up to 2.8, ``X*10000 + Y*100 + Z``
    from 2.9 on (what ``ncclGetVersion`` and ``cupy.cuda.nccl.get_version()`` return)."""
    if major <= 2 and minor <= 8:
        return major * 1000 + minor * 100 + patch
    return major * 10000 + minor * 100 + patch


def version_string(code: int) -> str:
    """``23203`` -> ``"2.32.3"``; ``2708`` -> ``"2.7.8"``."""
    if code >= 10000:
        return f"{code // 10000}.{code // 100 % 100}.{code % 100}"
    return f"{code // 1000}.{code // 100 % 10}.{code % 100}"


AVG_SINCE = version_code(2, 10)
BFLOAT16_SINCE = version_code(2, 10)
PREMUL_SUM_SINCE = version_code(2, 11)
SPLIT_SINCE = version_code(2, 18, 1)
FP8_SINCE = version_code(2, 24)
#: NCCL reduces fp8 only on GPUs of compute capability 9.0 (sm90) and newer
FP8_REDUCTION_CAPABILITY = 90

#: ncclDataType_t values (nccl.h), with the first NCCL version that has each.
NCCL_TYPES: Dict[str, Tuple[int, int]] = {
    "int8": (0, 0),
    "uint8": (1, 0),
    "int32": (2, 0),
    "uint32": (3, 0),
    "int64": (4, 0),
    "uint64": (5, 0),
    "float16": (6, 0),
    "float32": (7, 0),
    "float64": (8, 0),
    "bfloat16": (9, BFLOAT16_SINCE),
    "float8_e4m3fn": (10, FP8_SINCE),  # ncclFloat8e4m3
    "float8_e5m2": (11, FP8_SINCE),  # ncclFloat8e5m2
}
UINT8 = NCCL_TYPES["uint8"][0]
INT32 = NCCL_TYPES["int32"][0]

#: dtypes NCCL has no type for, carried as another: complex as pairs of reals, bool as bytes.
CARRIED_AS: Dict[str, str] = {"complex64": "float32", "complex128": "float64", "bool": "uint8"}

#: ncclRedOp_t values of the built-in ops (nccl.h).
NCCL_OPS: Dict[ReduceOp, int] = {
    ReduceOp.SUM: 0,
    ReduceOp.PRODUCT: 1,
    ReduceOp.MAX: 2,
    ReduceOp.MIN: 3,
    ReduceOp.AVG: 4,
}
_COMPLEX_OPS = frozenset({ReduceOp.SUM, ReduceOp.AVG, ReduceOp.PREMUL_SUM})


@functools.lru_cache(maxsize=None)
def reducible_dtypes(version: int) -> Dict[str, int]:
    """dtype name -> ncclDataType_t of the elements it travels as, for every dtype NCCL of
    ``version`` can reduce (complex as its real type, bool as uint8)."""
    table = {name: code for name, (code, since) in NCCL_TYPES.items() if version >= since}
    for name, carrier in CARRIED_AS.items():
        if carrier in table:
            table[name] = table[carrier]
    return table


def nccl_dtypes(version: int) -> Dict[str, int]:
    """The transport's ``dtypes``: every dtype it can move. Those NCCL cannot reduce (int16,
    uint16; fp8 before NCCL 2.24) travel as bytes (uint8) in broadcast and allgather."""
    table = {name: UINT8 for name in DTYPES}
    table.update(reducible_dtypes(version))
    return table


def elements(dtype: DType, count: int, reducible: Dict[str, int]) -> Tuple[int, int]:
    """``(ncclDataType_t, count)`` for ``count`` elements of ``dtype``: complex doubles the
    count; a dtype NCCL cannot reduce travels as ``count * itemsize`` bytes."""
    code = reducible.get(dtype.name)
    if code is None:
        return UINT8, count * dtype.itemsize
    return code, count * 2 if dtype.kind == "c" else count


def builtin_op(op: Op, dtype: DType) -> int:
    """ncclRedOp_t of a built-in op (bool: sum/prod as max/min)."""
    return NCCL_OPS[reduction_kind(op, dtype)]


#: largest finite value of each float dtype NCCL reduces (bfloat16 and fp8 have no NumPy type)
MAX_FINITE: Dict[str, float] = {
    "float16": 65504.0,
    "bfloat16": 3.3895313892515355e38,
    "float32": 3.4028234663852886e38,
    "float64": math.inf,
    "float8_e4m3fn": 448.0,
    "float8_e5m2": 57344.0,
}
_SMALL_FLOATS = ("bfloat16", "float8_e4m3fn", "float8_e5m2")


def max_finite(name: str) -> float:
    """Largest finite value of a float dtype (inf for integers: any factor is cast)."""
    return MAX_FINITE.get(name, math.inf)


def _small_float_bytes(value: float, name: str) -> bytes:
    """``value`` rounded to nearest-even in bfloat16 or an fp8 format: through ml_dtypes' NumPy
    types where installed, else a torch cast (these dtypes reach NCCL only as torch tensors)."""
    try:
        import ml_dtypes  # noqa: PLC0415 - optional
    except ImportError:
        pass
    else:
        return np.array(value, np.float64).astype(getattr(ml_dtypes, name)).tobytes()
    try:
        import torch  # noqa: PLC0415 - optional
    except ImportError:
        raise OpError(
            f"PreMulSum on {name} needs ml_dtypes or torch to encode its factor (pip install ml_dtypes)"
        ) from None
    return torch.tensor([value], dtype=torch.float64).to(getattr(torch, name)).view(torch.uint8).numpy().tobytes()


def premul_scalar(factor: float, name: str) -> bytes:
    """The PreMulSum factor in the memory format of the dtype ``name`` (a real dtype: complex
    inputs are scaled through their real type), as ``ncclScalarHostImmediate`` reads it. Integer
    dtypes take the factor's integer part, modulo 2**bits."""
    if name in _SMALL_FLOATS:
        return _small_float_bytes(float(factor), name)
    if name in ("float16", "float32", "float64"):
        return np.array(float(factor), np.float64).astype(name).tobytes()
    if name in ("int8", "uint8", "int32", "uint32", "int64", "uint64"):
        return np.array(int(factor) % (1 << (8 * np.dtype(name).itemsize)), np.uint64).astype(name).tobytes()
    raise OpError(f"PreMulSum has no NCCL scalar for dtype {name}")


def check_op(op: Op, dtype: DType, version: int) -> None:
    """What NCCL of ``version`` cannot do beyond the common tables: reduce a dtype it has no
    type for, complex other than sum/avg/premul_sum, avg before 2.10, PreMulSum before 2.11 or
    with a factor the dtype cannot hold."""
    kind = op_kind(op)
    if dtype.name not in reducible_dtypes(version):
        since = NCCL_TYPES.get(dtype.name, (None, None))[1]
        why = f"it needs NCCL >= {version_string(since)}" if since else "NCCL has no such type"
        raise ArgumentError(
            f"dtype {dtype.name} cannot be reduced by the nccl transport ({why}; this is NCCL "
            f"{version_string(version)}); broadcast and allgather move it, reductions need a wider dtype or the "
            "mpi backend"
        )
    if dtype.kind == "c" and kind not in _COMPLEX_OPS:
        raise OpError(
            f"op {op} is not supported for {dtype.name} by the nccl transport: NCCL reduces complex numbers as "
            "pairs of reals, which is right for sum, avg and PreMulSum with a real factor only; use the mpi "
            "backend for a complex product"
        )
    if kind is ReduceOp.AVG and version < AVG_SINCE:
        raise OpError(f"op avg needs NCCL >= 2.10 (this is NCCL {version_string(version)}); use sum and divide")
    if isinstance(op, PreMulSum):
        if version < PREMUL_SUM_SINCE:
            raise OpError(
                f"PreMulSum needs NCCL >= 2.11 (this is NCCL {version_string(version)}); scale the input and use sum"
            )
        carrier = CARRIED_AS.get(dtype.name, dtype.name)
        if abs(float(op.factor)) > max_finite(carrier):
            raise OpError(
                f"PreMulSum factor {op.factor!r} is beyond the range of {carrier} (largest {max_finite(carrier)!r}); "
                "use a smaller factor or a wider dtype"
            )


# -- the C API that CuPy does not wrap, declared as data ------------------------------------------


class Function(NamedTuple):
    name: str
    restype: Any
    argtypes: List[Any]


_result_t = ctypes.c_int  # ncclResult_t
_comm_t = ctypes.c_void_p  # ncclComm_t
_red_op_t = ctypes.c_int  # ncclRedOp_t
_data_type_t = ctypes.c_int  # ncclDataType_t
SCALAR_HOST_IMMEDIATE = 1  # ncclScalarHostImmediate (ncclScalarResidence_t)

FUNCTIONS: List[Function] = [
    # const char* ncclGetErrorString(ncclResult_t result);
    Function("ncclGetErrorString", ctypes.c_char_p, [_result_t]),
    # ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t *op, void *scalar, ncclDataType_t datatype,
    #                                       ncclScalarResidence_t residence, ncclComm_t comm);
    Function(
        "ncclRedOpCreatePreMulSum",
        _result_t,
        [ctypes.POINTER(_red_op_t), ctypes.c_void_p, _data_type_t, ctypes.c_int, _comm_t],
    ),
    # ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm);
    Function("ncclRedOpDestroy", _result_t, [_red_op_t, _comm_t]),
    # const char* ncclGetLastError(ncclComm_t comm);   (NCCL >= 2.13)
    Function("ncclGetLastError", ctypes.c_char_p, [_comm_t]),
]


class NCCLError(DenseCCLError, RuntimeError):
    """A call into libnccl returned an error."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def loaded_nccl_path() -> Optional[str]:
    """Path of the libnccl already mapped into this process (the one CuPy loaded), if any."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                path = line.rstrip("\n").rpartition(" ")[2]
                if "/libnccl.so" in path:
                    return path
    except OSError:
        return None
    return None


class NCCLLibrary:
    """The functions of :data:`FUNCTIONS`, bound once per library path. Missing symbols (an old
    NCCL) are bound as None and raise when called."""

    #: first candidate asked for -> (the path that loaded, its bound functions)
    _bound: ClassVar[Dict[str, Tuple[str, Dict[str, Any]]]] = {}

    def __init__(self, path: Optional[str] = None) -> None:
        # By soname first: the dynamic linker then returns the libnccl already loaded under that
        # name, which is the one CuPy's extension was linked against; else the mapped file.
        candidates: List[Optional[str]] = [path] if path else ["libnccl.so.2", loaded_nccl_path()]
        asked = next((c for c in candidates if c), "libnccl.so.2")
        self.path, functions = self._bound.get(asked, (asked, None))
        if functions is None:
            library, problem = None, None
            for candidate in filter(None, candidates):
                try:
                    library = ctypes.CDLL(candidate)
                    self.path = candidate
                    break
                except OSError as error:
                    problem = error
            if library is None:
                raise DenseCCLError(f"cannot load the NCCL library {' or '.join(filter(None, candidates))}: {problem}")
            functions = {}
            for function in FUNCTIONS:
                symbol = getattr(library, function.name, None)
                if symbol is not None:
                    symbol.restype = function.restype
                    symbol.argtypes = function.argtypes
                functions[function.name] = symbol
            self._bound[asked] = (self.path, functions)
        self._functions = functions

    def _function(self, name: str) -> Any:
        function = self._functions[name]
        if function is None:
            raise DenseCCLError(f"{self.path} has no {name}; it is too old for this feature")
        return function

    def error_string(self, result: int) -> str:
        raw = self._function("ncclGetErrorString")(result)
        return raw.decode(errors="replace") if raw else f"error {result}"

    def NCCL_CHECK(self, result: int, what: str, comm: Optional[int] = None) -> None:  # noqa: N802 - vLLM's name
        """Turn a non-zero ncclResult_t into :class:`NCCLError` with NCCL's own words."""
        if result == 0:
            return
        detail = ""
        last = self._functions.get("ncclGetLastError")
        if last is not None and comm:
            raw = last(comm)
            detail = f" ({raw.decode(errors='replace')})" if raw else ""
        raise NCCLError(f"{what} failed: {self.error_string(result)}{detail}", result)

    def create_premul_sum(self, scalar: bytes, datatype: int, comm: int) -> int:
        """A PreMulSum op whose factor is read from ``scalar`` now (host-immediate)."""
        op = _red_op_t()
        buffer = ctypes.create_string_buffer(scalar, len(scalar))
        result = self._function("ncclRedOpCreatePreMulSum")(
            ctypes.byref(op), ctypes.cast(buffer, ctypes.c_void_p), datatype, SCALAR_HOST_IMMEDIATE, comm
        )
        self.NCCL_CHECK(result, "ncclRedOpCreatePreMulSum", comm)
        return op.value

    def destroy_op(self, op: int, comm: int) -> None:
        self.NCCL_CHECK(self._function("ncclRedOpDestroy")(op, comm), "ncclRedOpDestroy", comm)


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
    """``factory(size, unique_id, rank)`` with the id in the form this CuPy takes."""
    return factory(size, raw if cupy_wants_bytes(cupy_version) else unique_id_tuple(raw), rank)


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
    """MPI's COMM_WORLD, or None when there is no MPI and no MPI launcher (a single rank)."""
    try:
        from mpi4py import MPI  # noqa: PLC0415
    except Exception as error:  # noqa: BLE001 - ImportError, or no MPI library behind mpi4py
        if config.launched_by_mpi():
            raise DenseCCLError(
                f"this looks like an MPI launch, but mpi4py cannot start ({type(error).__name__}: {error}); install "
                "it with pip install 'denseccl[mpi]', or launch with torchrun-style variables"
            ) from None
        return None
    return MPI.COMM_WORLD


def init_nccl(
    comm: Any,
    check: bool,
    timeout: Optional[float],
    deadline: Optional[float],
    *,
    store: Any = None,
    rank: Optional[int] = None,
    size: Optional[int] = None,
    device: Optional[int] = None,
    prefix: str = "denseccl",
) -> Communicator:
    """A Communicator over NCCL (launches and devices: docs/nccl.md); the store's unique id
    exchange and the first barrier are bounded by ``deadline``."""
    cupy, nccl = _require_nccl()
    from ...board.control import open_store_control  # noqa: PLC0415
    from ..store import SoloControl, wait_for_keys  # noqa: PLC0415
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

    with cupy.cuda.Device(device):
        nccl_comm = make_communicator(nccl.NcclCommunicator, size, raw, rank, cupy.__version__)
    transport = NCCLTransport(nccl_comm, device, timeout=timeout, version=nccl.get_version())
    try:
        transport.barrier().synchronize(deadline)  # fail early, in the constructor (vLLM does the same)
    except BaseException:
        transport.close()
        control.close()
        raise
    return Communicator(transport, control, check=check, timeout=timeout)


__all__ = [
    "NCCLError", "NCCLLibrary", "check_op", "elements", "init_nccl", "max_finite", "nccl_dtypes", "nccl_missing",
    "nccl_usable", "premul_scalar", "reducible_dtypes", "unique_id_bytes", "version_code", "version_string",
]
