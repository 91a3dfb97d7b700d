"""NCCL transport: ``cupy.cuda.nccl`` collectives on device storage spans, on CUDA streams.

Each method maps ``(pointer, count, dtype, op, root, stream)`` to one ``NcclCommunicator`` call.
What NCCL lacks is mapped onto what it has, never by an extra pass over the data:

- complex numbers travel as pairs of reals (``count * 2``), which is right for sum, avg and
  premul_sum with a real factor, and is refused for prod (torch's ``supports_complex`` rule);
- bool travels as uint8, with sum/prod as max/min (logical or/and, ``ops.BOOL_OPS``);
- ``PreMulSum(f)`` is NCCL's own ``ncclRedOpCreatePreMulSum`` (reached through ctypes on the
  libnccl that CuPy loaded, with the communicator's raw handle), created once per
  ``(factor, dtype)`` and destroyed at :meth:`NCCLTransport.close`;
- broadcast and allgather of a dtype NCCL has no type for (int16, uint16) move bytes.

Streams and completion: a call runs on the :class:`~denseccl.arrays.StreamRef` the communicator
resolved (the array's current stream unless ``stream=`` was given) and records a CUDA event
after it. :meth:`NCCLPending.wait` makes the caller's *current* stream wait for that event (no
host synchronisation; nothing at all when the call ran on the current stream);
:meth:`NCCLPending.synchronize` blocks the host, polling the event and
``ncclCommGetAsyncError`` until the deadline, and aborts the communicator
(``ncclCommAbort``) when it passes. A watchdog thread per transport does the same for work
nobody waits on: a collective still unfinished ``timeout`` seconds after it was enqueued, or an
asynchronous NCCL error, aborts the communicator, and every later call raises.

The pure parts (version gates, dtype and op tables, PreMulSum scalars, the watchdog) need no
GPU and are tested on the CPU; the CUDA runtime and the NCCL communicator are passed in, so
tests can replace them with fakes.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import functools
import math
import struct
import threading
import time
from typing import Any, Callable, ClassVar, Deque, Dict, List, NamedTuple, Optional, Tuple

from ..arrays import StreamRef, current_stream_pointer, stream_pointer
from ..errors import CollectiveTimeoutError, CommunicatorBrokenError, DenseCCLError, LayoutError
from ..ops import BOOL_OPS, DTYPES, DType, Op, PreMulSum, ReduceOp, op_kind
from .base import Pending, Transport, wait_until

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
SCALAR_HOST_IMMEDIATE = 1  # ncclScalarHostImmediate
NOT_READY = 600  # cudaErrorNotReady


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
    kind = op_kind(op)
    if dtype.kind == "b":
        kind = BOOL_OPS[kind]
    return NCCL_OPS[kind]


class _Format(NamedTuple):
    """A binary floating-point format: significant bits (with the implicit one), smallest
    normal exponent, exponent bias and field width, largest finite value, whether it has inf."""

    precision: int
    emin: int
    bias: int
    exponent_bits: int
    max_finite: float
    has_inf: bool


_FORMATS: Dict[str, _Format] = {
    "float16": _Format(11, -14, 15, 5, 65504.0, True),
    "bfloat16": _Format(8, -126, 127, 8, (2 - 2**-7) * 2.0**127, True),
    "float8_e4m3fn": _Format(4, -6, 7, 4, 448.0, False),
    "float8_e5m2": _Format(3, -14, 15, 5, 57344.0, True),
}


def max_finite(name: str) -> float:
    """Largest finite value of a float dtype."""
    if name in _FORMATS:
        return _FORMATS[name].max_finite
    return {"float32": float(struct.unpack("<f", b"\xff\xff\x7f\x7f")[0]), "float64": math.inf}.get(name, math.inf)


def encode_small_float(value: float, name: str) -> int:
    """Bits of ``value`` rounded to nearest (ties to even) in a 16- or 8-bit float format;
    beyond the largest finite value: inf where the format has one, else that largest value."""
    fmt = _FORMATS[name]
    mantissa_bits = fmt.precision - 1
    sign = 1 if math.copysign(1.0, value) < 0 else 0
    top = sign << (fmt.exponent_bits + mantissa_bits)
    magnitude = abs(value)
    all_ones = (1 << fmt.exponent_bits) - 1
    if math.isnan(magnitude):
        if fmt.has_inf:
            return top | (all_ones << mantissa_bits) | (1 << (mantissa_bits - 1))
        return top | (all_ones << mantissa_bits) | ((1 << mantissa_bits) - 1)
    if magnitude == 0:
        return top
    if not math.isinf(magnitude):
        _, exponent = math.frexp(magnitude)  # magnitude = m * 2**exponent, 0.5 <= m < 1
        quantum = max(exponent - fmt.precision, fmt.emin - mantissa_bits)
        magnitude = round(math.ldexp(magnitude, -quantum)) * 2.0**quantum  # round() ties to even
    if magnitude == 0:  # rounded to zero
        return top
    if magnitude > fmt.max_finite:
        if fmt.has_inf:
            return top | (all_ones << mantissa_bits)
        magnitude = fmt.max_finite
    _, exponent = math.frexp(magnitude)
    unbiased = exponent - 1
    if unbiased < fmt.emin:  # subnormal
        return top | int(math.ldexp(magnitude, mantissa_bits - fmt.emin))
    fraction = int(math.ldexp(magnitude, mantissa_bits - unbiased)) - (1 << mantissa_bits)
    return top | ((unbiased + fmt.bias) << mantissa_bits) | fraction


def premul_scalar(factor: float, name: str) -> bytes:
    """The PreMulSum factor in the memory format of the dtype ``name`` (a real dtype: complex
    inputs are scaled through their real type), as ``ncclScalarHostImmediate`` reads it."""
    if name in _FORMATS:
        bits = encode_small_float(float(factor), name)
        return bits.to_bytes(1 if name.startswith("float8") else 2, "little")
    if name == "float32":
        return struct.pack("<f", float(factor))
    if name == "float64":
        return struct.pack("<d", float(factor))
    sizes = {"int8": 1, "uint8": 1, "int32": 4, "uint32": 4, "int64": 8, "uint64": 8}
    if name in sizes:
        width = sizes[name]
        return (int(factor) % (1 << (8 * width))).to_bytes(width, "little")
    raise LayoutError(f"PreMulSum has no NCCL scalar for dtype {name}")


def check_op(op: Op, dtype: DType, version: int) -> None:
    """What NCCL of ``version`` cannot do beyond the common tables: reduce a dtype it has no
    type for, complex other than sum/avg/premul_sum, avg before 2.10, PreMulSum before 2.11 or
    with a factor the dtype cannot hold."""
    kind = op_kind(op)
    if dtype.name not in reducible_dtypes(version):
        since = NCCL_TYPES.get(dtype.name, (None, None))[1]
        why = f"it needs NCCL >= {version_string(since)}" if since else "NCCL has no such type"
        raise LayoutError(
            f"dtype {dtype.name} cannot be reduced by the nccl transport ({why}; this is NCCL "
            f"{version_string(version)}); broadcast and allgather move it, reductions need a wider dtype or the "
            "mpi backend"
        )
    if dtype.kind == "c" and kind not in _COMPLEX_OPS:
        raise LayoutError(
            f"op {op} is not supported for {dtype.name} by the nccl transport: NCCL reduces complex numbers as "
            "pairs of reals, which is right for sum, avg and PreMulSum with a real factor only; use the mpi "
            "backend for a complex product"
        )
    if kind is ReduceOp.AVG and version < AVG_SINCE:
        raise LayoutError(f"op avg needs NCCL >= 2.10 (this is NCCL {version_string(version)}); use sum and divide")
    if isinstance(op, PreMulSum):
        if version < PREMUL_SUM_SINCE:
            raise LayoutError(
                f"PreMulSum needs NCCL >= 2.11 (this is NCCL {version_string(version)}); scale the input and use sum"
            )
        carrier = CARRIED_AS.get(dtype.name, dtype.name)
        if abs(float(op.factor)) > max_finite(carrier):
            raise LayoutError(
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

FUNCTIONS: List[Function] = [
    # const char* ncclGetErrorString(ncclResult_t result);
    Function("ncclGetErrorString", ctypes.c_char_p, [_result_t]),
    # ncclResult_t ncclGetVersion(int *version);
    Function("ncclGetVersion", _result_t, [ctypes.POINTER(ctypes.c_int)]),
    # ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t *op, void *scalar, ncclDataType_t datatype,
    #                                       ncclScalarResidence_t residence, ncclComm_t comm);
    Function(
        "ncclRedOpCreatePreMulSum",
        _result_t,
        [ctypes.POINTER(_red_op_t), ctypes.c_void_p, _data_type_t, ctypes.c_int, _comm_t],
    ),
    # ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm);
    Function("ncclRedOpDestroy", _result_t, [_red_op_t, _comm_t]),
    # ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError);
    Function("ncclCommGetAsyncError", _result_t, [_comm_t, ctypes.POINTER(_result_t)]),
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

    _bound: ClassVar[Dict[str, Dict[str, Any]]] = {}

    def __init__(self, path: Optional[str] = None) -> None:
        # By soname first: the dynamic linker then returns the libnccl already loaded under that
        # name, which is the one CuPy's extension was linked against; else the mapped file.
        candidates = [path] if path else ["libnccl.so.2", loaded_nccl_path()]
        self.path = next((c for c in candidates if c), "libnccl.so.2")
        functions = self._bound.get(self.path)
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
            self._bound[self.path] = functions
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

    def version(self) -> int:
        value = ctypes.c_int()
        self.NCCL_CHECK(self._function("ncclGetVersion")(ctypes.byref(value)), "ncclGetVersion")
        return value.value

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


# -- the CUDA runtime calls the transport makes (a fake replaces this on the CPU) ----------------


class CudaEvents:
    """CUDA events, stream waits and a scratch buffer through CuPy's runtime bindings."""

    def __init__(self, device: int) -> None:
        import cupy  # noqa: PLC0415 - device transport only

        self._cupy = cupy
        self._runtime = cupy.cuda.runtime
        self.device = device

    def _on_device(self) -> Any:
        if self._runtime.getDevice() == self.device:
            return contextlib.nullcontext()
        return self._cupy.cuda.Device(self.device)

    def record(self, stream: int) -> Any:
        """A new event recorded on ``stream`` (after the work enqueued there so far)."""
        with self._on_device():
            event = self._cupy.cuda.Event(block=False, disable_timing=True)
        self._runtime.eventRecord(event.ptr, stream)
        return event

    def done(self, event: Any) -> bool:
        status = self._runtime.eventQuery(event.ptr)
        if status == 0:
            return True
        if status != NOT_READY:
            self._runtime.check_status(status)
        return False

    def wait(self, stream: int, event: Any) -> None:
        """Make ``stream`` wait for ``event`` (no host synchronisation)."""
        self._runtime.streamWaitEvent(stream, event.ptr, 0)

    def current(self, ref: StreamRef) -> int:
        return current_stream_pointer(ref.library, ref.device)

    def default_stream(self) -> StreamRef:
        return StreamRef(current_stream_pointer("cupy", self.device), "cupy", self.device)

    def bind_thread(self) -> None:
        """Make this device current in the calling thread (the watchdog's)."""
        self._runtime.setDevice(self.device)

    def scratch(self, nbytes: int) -> Any:
        """Device memory of ``nbytes`` (an object with ``.ptr``; freed when dropped)."""
        with self._on_device():
            return self._cupy.cuda.alloc(nbytes)


# -- the watchdog ----------------------------------------------------------------------------------


class _Entry:
    """One enqueued collective: armed with its event once the enqueue call has returned."""

    __slots__ = ("what", "deadline", "event", "cancelled")

    def __init__(self, what: str, deadline: Optional[float]) -> None:
        self.what = what
        self.deadline = deadline
        self.event: Any = None
        self.cancelled = False


class Watchdog:
    """Watches enqueued work from a daemon thread, as torch's ProcessGroupNCCL does.

    Entries complete in order on the oldest's stream, so only the oldest unfinished entry can be
    late; while any is in flight the thread also polls for asynchronous errors. On a verdict it
    calls ``on_failure(reason, timed_out)`` once and stops. With nothing in flight it sleeps on
    a condition and costs nothing.
    """

    def __init__(
        self,
        timeout: Optional[float],
        done: Callable[[Any], bool],
        async_error: Callable[[], Optional[str]],
        on_failure: Callable[[str, bool], None],
        interval: float = 0.02,
        on_start: Optional[Callable[[], None]] = None,
    ) -> None:
        self.timeout = timeout
        self._on_start = on_start
        self._done = done
        self._async_error = async_error
        self._on_failure = on_failure
        self._interval = interval
        self._entries: Deque[_Entry] = collections.deque()
        self._condition = threading.Condition()
        self._thread: Optional[threading.Thread] = None
        self._stopped = False

    def begin(self, what: str) -> _Entry:
        """Track a collective about to be enqueued (its enqueue may block, e.g. while NCCL
        connects to a peer that never comes: that counts against the deadline too)."""
        entry = _Entry(what, None if self.timeout is None else time.monotonic() + self.timeout)
        with self._condition:
            if self._stopped:
                return entry
            self._entries.append(entry)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="denseccl-nccl-watchdog", daemon=True)
                self._thread.start()
            self._condition.notify()
        return entry

    @staticmethod
    def arm(entry: _Entry, event: Any) -> None:
        entry.event = event

    @staticmethod
    def cancel(entry: _Entry) -> None:
        entry.cancelled = True

    @property
    def in_flight(self) -> int:
        return len(self._entries)

    def check(self) -> Optional[Tuple[str, bool]]:
        """One look: drop finished entries; ``(reason, timed_out)`` if the oldest is late or
        NCCL reports an asynchronous error, else None."""
        entries = self._entries
        try:
            while entries:
                head = entries[0]
                if head.cancelled or (head.event is not None and self._done(head.event)):
                    entries.popleft()
                    continue
                break
            if not entries:
                return None
            head = entries[0]
            if head.deadline is not None and time.monotonic() > head.deadline:
                return (
                    f"NCCL {head.what} did not complete within {self.timeout:g} s (a peer never joined, crashed or "
                    "is stuck); the watchdog aborted the NCCL communicator",
                    True,
                )
            error = self._async_error()
        except Exception as error:  # noqa: BLE001 - a CUDA error while polling ends the communicator too
            return f"checking NCCL work failed: {type(error).__name__}: {error}", False
        if error:
            return error, False
        return None

    def _run(self) -> None:
        if self._on_start is not None:
            try:
                self._on_start()
            except Exception as error:  # noqa: BLE001
                self._on_failure(f"the NCCL watchdog could not start: {type(error).__name__}: {error}", False)
                return
        while True:
            with self._condition:
                while not self._entries and not self._stopped:
                    self._condition.wait()
                if self._stopped:
                    return
            verdict = self.check()
            if verdict is not None:
                with self._condition:
                    if self._stopped:
                        return
                    self._stopped = True
                self._on_failure(*verdict)
                return
            time.sleep(self._interval)

    def close(self) -> None:
        with self._condition:
            self._stopped = True
            self._condition.notify_all()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5.0)
        self._entries.clear()


# -- the transport -------------------------------------------------------------------------------


class NCCLPending(Pending):
    """An enqueued NCCL call and the event recorded after it on its stream."""

    __slots__ = ("_transport", "_event", "_stream", "_host")

    def __init__(self, transport: "NCCLTransport", event: Any, stream: StreamRef, host: bool = False) -> None:
        self._transport = transport
        self._event = event
        self._stream = stream
        self._host = host  # barrier: wait() blocks the host

    def test(self) -> bool:
        transport = self._transport
        return transport._failure is not None or transport.events.done(self._event)

    def wait(self, deadline: Optional[float]) -> None:
        """Make the caller's current stream wait for the call (free when the call ran there)."""
        if self._host:
            self.synchronize(deadline)
            return
        transport = self._transport
        transport.raise_if_failed()
        current = transport.events.current(self._stream)
        if current != self._stream.pointer:
            transport.events.wait(current, self._event)

    def synchronize(self, deadline: Optional[float]) -> None:
        """Block the host until the call has completed; past ``deadline`` abort the
        communicator and raise :class:`CollectiveTimeoutError`."""
        transport = self._transport

        def finished() -> bool:
            if transport._failure is not None or transport.events.done(self._event):
                return True
            error = transport.async_error()
            if error:
                transport.abort(error, timed_out=False)
                return True
            return False

        try:
            wait_until(finished, deadline, "NCCL collective")
        except CollectiveTimeoutError as error:
            reason = f"{error} (the NCCL communicator was aborted with ncclCommAbort)"
            transport.abort(reason, timed_out=True)
            raise CollectiveTimeoutError(reason) from None
        transport.raise_if_failed()


def raw_handle(comm: Any) -> int:
    """The ``ncclComm_t`` of a CuPy ``NcclCommunicator`` (``.comm``; ``.ptr`` elsewhere)."""
    for attribute in ("comm", "ptr"):
        value = getattr(comm, attribute, None)
        if isinstance(value, int):
            return value
    raise DenseCCLError(f"cannot find the raw ncclComm_t of {comm!r} (no .comm or .ptr)")


class NCCLTransport(Transport):
    """Collectives over one CuPy ``NcclCommunicator`` (owned: :meth:`close` destroys it) bound
    to one CUDA device."""

    name = "nccl"
    device_memory = True

    def __init__(
        self,
        comm: Any,
        device: int,
        *,
        timeout: Optional[float] = None,
        version: Optional[int] = None,
        events: Any = None,
        library: Optional[NCCLLibrary] = None,
        watchdog_interval: float = 0.02,
    ) -> None:
        self.comm = comm
        self.device = device
        self.rank = comm.rank_id()
        self.size = comm.size()
        self.timeout = timeout
        if version is None:
            from cupy.cuda import nccl  # noqa: PLC0415

            version = nccl.get_version()
        self.version: int = version
        self.dtypes = nccl_dtypes(version)
        self._reducible = reducible_dtypes(version)
        self.events = events if events is not None else CudaEvents(device)
        self._library = library
        self._premul: "collections.OrderedDict[Tuple[float, str], int]" = collections.OrderedDict()
        self._failure: Optional[Tuple[str, bool]] = None
        self._lock = threading.Lock()
        self._closed = False
        self._scratch: Any = None
        self._watchdog = Watchdog(
            timeout, self.events.done, self.async_error, self.abort, watchdog_interval, getattr(self.events, "bind_thread", None)
        )

    def __repr__(self) -> str:
        return f"<NCCLTransport rank {self.rank} of {self.size} on cuda:{self.device}, NCCL {version_string(self.version)}>"

    # -- state ---------------------------------------------------------------------------------

    @property
    def library(self) -> NCCLLibrary:
        if self._library is None:
            self._library = NCCLLibrary()
        return self._library

    def failure(self) -> Optional[str]:
        return None if self._failure is None else self._failure[0]

    def raise_if_failed(self) -> None:
        if self._failure is not None:
            reason, timed_out = self._failure
            raise (CollectiveTimeoutError if timed_out else CommunicatorBrokenError)(reason)

    def async_error(self) -> Optional[str]:
        """NCCL's asynchronous error of this communicator as text, or None."""
        if self._failure is not None or self._closed:
            return None
        try:
            self.comm.check_async_error()
        except Exception as error:  # noqa: BLE001 - cupy raises NcclError
            return f"NCCL reported an asynchronous error: {error}"
        return None

    def abort(self, reason: str, timed_out: bool = False) -> None:
        """Abort the NCCL communicator (unblocking its kernels); every later call raises."""
        with self._lock:
            if self._failure is not None:
                return
            self._failure = (reason, timed_out)
        self._watchdog.close()
        self._premul.clear()  # the ops die with the communicator
        if not self._closed:
            try:
                self.comm.abort()
            except Exception:  # noqa: BLE001 - aborting is the last resort; nothing more to do
                pass

    def check_op(self, op: Op, dtype: DType) -> None:
        check_op(op, dtype, self.version)

    # -- plumbing ------------------------------------------------------------------------------

    def _stream(self, stream: Any) -> StreamRef:
        if isinstance(stream, StreamRef):
            return stream
        if stream is None:
            return self.events.default_stream()
        return StreamRef(stream_pointer(stream), "cupy", self.device)

    def _launch(self, what: str, stream: Any, call: Callable[..., Any], *args: Any, host: bool = False) -> NCCLPending:
        self.raise_if_failed()
        ref = self._stream(stream)
        entry = self._watchdog.begin(what)
        try:
            call(*args, ref.pointer)
            event = self.events.record(ref.pointer)
        except BaseException:
            Watchdog.cancel(entry)
            raise
        Watchdog.arm(entry, event)
        return NCCLPending(self, event, ref, host)

    def _reduction(self, op: Op, dtype: DType) -> int:
        if not isinstance(op, PreMulSum):
            return builtin_op(op, dtype)
        carrier = CARRIED_AS.get(dtype.name, dtype.name)
        key = (float(op.factor), carrier)
        found = self._premul.get(key)
        if found is not None:
            self._premul.move_to_end(key)
            return found
        created = self.library.create_premul_sum(premul_scalar(op.factor, carrier), self._reducible[carrier], raw_handle(self.comm))
        self._premul[key] = created
        if len(self._premul) > 64:  # an op may be destroyed once the calls given it have returned
            _, oldest = self._premul.popitem(last=False)
            self.library.destroy_op(oldest, raw_handle(self.comm))
        return created

    def _elements(self, dtype: DType, count: int, *, reducing: bool) -> Tuple[int, int]:
        if reducing:
            check_op(ReduceOp.SUM, dtype, self.version)
        return elements(dtype, count, self._reducible)

    # -- collectives ---------------------------------------------------------------------------

    def allreduce(self, send: int, recv: int, count: int, dtype: DType, op: Op, stream: Any = None) -> Pending:
        code, n = self._elements(dtype, count, reducing=True)
        return self._launch("allreduce", stream, self.comm.allReduce, send, recv, n, code, self._reduction(op, dtype))

    def reduce(self, send: int, recv: int, count: int, dtype: DType, op: Op, root: int, stream: Any = None) -> Pending:
        code, n = self._elements(dtype, count, reducing=True)
        return self._launch("reduce", stream, self.comm.reduce, send, recv, n, code, self._reduction(op, dtype), root)

    def broadcast(self, buffer: int, count: int, dtype: DType, root: int, stream: Any = None) -> Pending:
        code, n = self._elements(dtype, count, reducing=False)
        return self._launch("broadcast", stream, self.comm.broadcast, buffer, buffer, n, code, root)

    def allgather(self, send: int, recv: int, count: int, dtype: DType, stream: Any = None) -> Pending:
        code, n = self._elements(dtype, count, reducing=False)
        return self._launch("allgather", stream, self.comm.allGather, send, recv, n, code)

    def reduce_scatter(self, send: int, recv: int, count: int, dtype: DType, op: Op, stream: Any = None) -> Pending:
        code, n = self._elements(dtype, count, reducing=True)
        return self._launch(
            "reduce_scatter", stream, self.comm.reduceScatter, send, recv, n, code, self._reduction(op, dtype)
        )

    def send(self, buffer: int, count: int, dtype: DType, peer: int, stream: Any = None) -> Pending:
        """Point-to-point send of ``count`` elements to ``peer`` (NCCL >= 2.7)."""
        code, n = self._elements(dtype, count, reducing=False)
        return self._launch("send", stream, self.comm.send, buffer, n, code, peer)

    def recv(self, buffer: int, count: int, dtype: DType, peer: int, stream: Any = None) -> Pending:
        """Point-to-point receive of ``count`` elements from ``peer`` (NCCL >= 2.7)."""
        code, n = self._elements(dtype, count, reducing=False)
        return self._launch("recv", stream, self.comm.recv, buffer, n, code, peer)

    def barrier(self) -> Pending:
        """A one-element allreduce on the current stream; waiting on it blocks the host."""
        if self._scratch is None:
            self._scratch = self.events.scratch(4)
        pointer = int(self._scratch.ptr)
        return self._launch("barrier", None, self.comm.allReduce, pointer, pointer, 1, INT32, NCCL_OPS[ReduceOp.SUM], host=True)

    # -- lifecycle -----------------------------------------------------------------------------

    def split(self, color: Optional[int], key: int) -> Optional["NCCLTransport"]:
        split = getattr(self.comm, "commSplit", None)
        if self.version < SPLIT_SINCE or split is None:
            raise DenseCCLError(
                f"splitting an NCCL communicator needs NCCL >= 2.18.1 (this is {version_string(self.version)}) and "
                f"CuPy's NcclCommunicator.commSplit (CuPy >= 14{'' if split is None else ', present'})"
            )
        self.raise_if_failed()
        part = split(-1 if color is None else color, key)
        if part is None:
            return None
        return NCCLTransport(part, self.device, timeout=self.timeout, version=self.version, events=self.events, library=self._library)

    def close(self) -> None:
        """Destroy the PreMulSum ops and the communicator (after an abort there is nothing left)."""
        if self._closed:
            return
        self._watchdog.close()
        self._closed = True
        if self._failure is None:
            handle = raw_handle(self.comm)
            for op in self._premul.values():
                with contextlib.suppress(Exception):
                    self.library.destroy_op(op, handle)
            self._premul.clear()
            self.comm.destroy()
        self._scratch = None


__all__ = [
    "CudaEvents",
    "NCCLError",
    "NCCLLibrary",
    "NCCLPending",
    "NCCLTransport",
    "Watchdog",
    "check_op",
    "elements",
    "encode_small_float",
    "nccl_dtypes",
    "premul_scalar",
    "reducible_dtypes",
    "version_code",
    "version_string",
]
