"""What the NCCL backend knows of libnccl without a GPU: the tables of what NCCL of each version
can do, and the part of its C API that CuPy does not wrap, reached through ctypes.

Why it exists: the transport (:mod:`.transport`) stays one call per collective because every
question about types, ops and versions is answered here, as data, and tested on the CPU.

- Tables: version codes and gates, the ``ncclDataType_t`` and ``ncclRedOp_t`` tables, and how a
  denseccl dtype and op map onto them: which type and count a call carries (:func:`elements`),
  which built-in op it names (:func:`builtin_op`), whether NCCL of its version can run an op on
  a dtype at all (:func:`check_op`), and the bytes of a PreMulSum factor in the dtype's own
  format (:func:`premul_scalar`: NumPy, ml_dtypes or a torch cast rounds it).
- The C API CuPy lacks, vLLM's pynccl pattern: the functions are declared as data
  (:data:`FUNCTIONS`, each with its C prototype), bound once per library path by
  :class:`NCCLLibrary`, preferring the libnccl that CuPy already loaded, and every
  ``ncclResult_t`` goes through one check (``NCCL_CHECK``) that raises :class:`NCCLError` with
  NCCL's own words. The transport needs it for PreMulSum ops (``ncclRedOpCreatePreMulSum`` /
  ``ncclRedOpDestroy``) on the communicator's raw handle; what CuPy wraps (the version,
  ``ncclCommGetAsyncError``, abort) is used through CuPy.
"""

from __future__ import annotations

import ctypes
import functools
import math
from typing import Any, ClassVar, Dict, List, NamedTuple, Optional, Tuple

import numpy as np

from ...dtypes import DTYPES, DType
from ...errors import ArgumentError, DenseCCLError, OpError
from ...ops import Op, PreMulSum, ReduceOp, op_kind, reduction_kind

# -- versions ------------------------------------------------------------------------------------


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

# -- tables --------------------------------------------------------------------------------------

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
    """The functions of :data:`FUNCTIONS`, bound once per library path (vLLM's pynccl
    pattern). Missing symbols (an old NCCL) are bound as None and raise when called."""

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


__all__ = [
    "NCCLError",
    "NCCLLibrary",
    "check_op",
    "elements",
    "max_finite",
    "nccl_dtypes",
    "premul_scalar",
    "reducible_dtypes",
    "version_code",
    "version_string",
]
