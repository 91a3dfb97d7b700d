"""The libnccl calls CuPy does not wrap (PreMulSum create/destroy, error strings), declared as
data (:data:`FUNCTIONS`) and bound through ctypes once per library path by
:class:`NCCLLibrary` (vLLM's pynccl pattern). Everything else goes through CuPy.

Why it exists: the transport needs these calls on a running communicator and the tests check
their declarations without a GPU; one job, apart from the tables (:mod:`.tables`) and the init.
"""

from __future__ import annotations

import ctypes
from typing import Any, ClassVar, Dict, List, NamedTuple, Optional, Tuple

from ...errors import DenseCCLError


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


__all__ = ["FUNCTIONS", "NCCLError", "NCCLLibrary", "loaded_nccl_path"]
