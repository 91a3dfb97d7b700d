"""The fakes that stand for CuPy and its NcclCommunicator in the CPU tests of the NCCL transport,
and the tests that keep them honest: every method and property a fake offers exists in the
installed CuPy with the same parameters (read from the signatures Cython embeds in CuPy's
docstrings) and the same C types, and refuses what CuPy refuses with the same exception, so a
fake cannot drift from the library it stands for.

``FakeComm`` records the NCCL calls; ``FakeCuda`` is a stand-in for the ``cupy`` module (Event,
Stream.from_external, Device, alloc, runtime) that records events, stream waits and captures.
What they refuse, as CuPy 14.2 does (cupy/cuda/stream.pyx, cupy_backends/cuda/api/runtime.pyx,
cupy_backends/cuda/libs/nccl.pyx):

- arguments typed ``intptr_t``, ``size_t`` or ``int`` take Python ints only (TypeError "an integer
  is required" for floats, NumPy integers, None), in range (OverflowError, e.g. a negative size_t);
- NCCL's errors are ``NcclError`` (a RuntimeError with ``.status``), ``check_async_error`` too; a
  call on an aborted or destroyed communicator (its handle is then 0) is ncclInvalidArgument;
- ``commSplit`` returns a communicator of the split's size (``split_size``: by default every rank
  passes the same color), or None for color -1;
- a communicator that is garbage collected is destroyed (CuPy's ``__dealloc__``);
- ``Stream.from_external`` validates the ``__cuda_stream__`` protocol (TypeError);
- ``Event.done`` never raises: it is ``runtime.eventQuery(ptr) == 0``, and ``runtime.eventQuery``
  returns the status (600 not ready, 700 a sticky error, 907 an event recorded in a capture, 900
  any query while a capture runs in global mode, which also invalidates that capture);
- ``Stream.is_capturing`` raises on an invalidated capture (RuntimeError), for the legacy
  stream while another stream captures (CUDARuntimeError cudaErrorStreamCaptureImplicit) and for
  a stream that does not exist (cudaErrorInvalidResourceHandle: one never created, or destroyed;
  ``FakeCuda.alive`` are those that exist);
- ``NcclError(status)`` names the status from CuPy's table of ncclResult_t 0-6: for any other
  (ncclInProgress, 7) building it raises ``KeyError(status)``, which is what CuPy then raises;
- ``destroy()`` (ncclCommDestroy) waits for the kernels of multi-rank calls
  (``commDestroySync`` synchronizes NCCL's device stream, which a launch joins to the caller's
  stream): here for the host functions that block a stream it was given (``FakeCuda.block``).
  With one rank NCCL plans nothing (enqueue.cc's ``taskAppend`` hands the call to onerank.cu's
  ``ncclLaunchOneRank``: nothing in place, a copy out of place, a kernel for PreMulSum, all on
  the caller's stream), so destroy waits for none of it; freeing memory (abort) still waits;
- a multi-rank call on a capturing stream leaves a persistent plan (``persistent_refs``,
  NCCL's ``localPersistentRefs``) that only the graph's destruction drops; ``destroy()`` and
  ``abort()`` then wait for it forever in NCCL (``commDestroySync``): the fake raises instead.
"""

from __future__ import annotations

import gc
import inspect
import itertools
import re
import threading
import time
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Dict, List, Optional, Tuple

import pytest

from denseccl.streams import StreamRef
from denseccl.backends.nccl import transport as nccl
from denseccl.backends.nccl.cuda import CudaStreams
from denseccl.backends.nccl.tables import version_code

VERSION = version_code(2, 27, 3)

# cudaError_t values the fakes return or raise (CUDA runtime API)
CUDA_SUCCESS, INVALID_HANDLE, NOT_READY, ILLEGAL_ADDRESS = 0, 400, 600, 700
CAPTURE_UNSUPPORTED, CAPTURE_INVALIDATED, CAPTURE_IMPLICIT, CAPTURED_EVENT = 900, 901, 906, 907
CUDA_ERRORS = {
    INVALID_HANDLE: "cudaErrorInvalidResourceHandle: invalid resource handle",
    NOT_READY: "cudaErrorNotReady: device not ready",
    ILLEGAL_ADDRESS: "cudaErrorIllegalAddress: an illegal memory access was encountered",
    CAPTURE_UNSUPPORTED: "cudaErrorStreamCaptureUnsupported: operation not permitted when stream is capturing",
    CAPTURE_INVALIDATED: "cudaErrorStreamCaptureInvalidated: operation failed due to a previous error during capture",
    CAPTURE_IMPLICIT: (
        "cudaErrorStreamCaptureImplicit: operation would make the legacy stream depend on a capturing blocking stream"
    ),
    CAPTURED_EVENT: "cudaErrorCapturedEvent: operation not permitted on an event last recorded in a capturing stream",
}
NCCL_INVALID_ARGUMENT = 4

# -- C argument conversion, as Cython does it -------------------------------------------------------

C_RANGES = {
    "intptr_t": (-(2**63), 2**63 - 1, "Python int too large to convert to C ssize_t"),
    "size_t": (0, 2**64 - 1, "Python int too large to convert to C unsigned long"),
    "int": (-(2**31), 2**31 - 1, "value too large to convert to int"),
}


def c_argument(value: Any, ctype: str) -> int:
    """``value`` converted to the C type ``ctype`` as a Cython ``def`` does, or its exception:
    ``intptr_t`` and ``size_t`` take Python ints only; ``int`` takes what has ``__int__``
    (a float is truncated), as CuPy 14.2's compiled module does."""
    if ctype == "int" and not isinstance(value, int) and hasattr(type(value), "__int__"):
        value = int(value)
    if not isinstance(value, int):
        raise TypeError("an integer is required")
    low, high, too_large = C_RANGES[ctype]
    if value < low:
        raise OverflowError(f"can't convert negative value to {ctype}" if low == 0 else too_large)
    if value > high:
        raise OverflowError(too_large)
    return int(value)


def typed(*ctypes: str) -> Callable[[Callable], Callable]:
    """Declare a fake method's C parameter types (checked against CuPy's own signatures below);
    the method then refuses what Cython refuses."""

    def wrap(method: Callable) -> Callable:
        names = list(inspect.signature(method).parameters)[1:]

        def checked(self: Any, *args: Any) -> Any:
            converted = [c_argument(value, ctype) for value, ctype in zip(args, ctypes)]
            return method(self, *converted, *args[len(ctypes):])

        checked.__signature__ = inspect.signature(method)  # type: ignore[attr-defined]
        checked.__name__ = method.__name__
        checked.c_types = dict(zip(names, ctypes))  # type: ignore[attr-defined]
        return checked

    return wrap


#: CuPy 14.2's names of ncclResult_t (ERROR2 in cupy_backends/cuda/libs/nccl.pyx): 0-6 only
NCCL_ERROR_NAMES = {
    0: "NCCL_ERROR_SUCCESS",
    1: "NCCL_ERROR_UNHANDLED_CUDA_ERROR",
    2: "NCCL_ERROR_SYSTEM_ERROR",
    3: "NCCL_ERROR_INTERNAL_ERROR",
    4: "NCCL_ERROR_INVALID_ARGUMENT",
    5: "NCCL_ERROR_INVALID_USAGE",
    6: "NCCL_ERROR_REMOTE_ERROR",
}


class NcclError(RuntimeError):
    """cupy.cuda.nccl.NcclError: the status travels as ``.status``; a status CuPy has no name
    for raises KeyError while the error is built (CuPy's ``ERROR2[status]``)."""

    def __init__(self, status: int) -> None:
        self.status = status
        super().__init__(f"{NCCL_ERROR_NAMES[status]}: NCCL error {status}")


class CUDARuntimeError(RuntimeError):
    """cupy.cuda.runtime.CUDARuntimeError: the status travels as ``.status``."""

    def __init__(self, status: int) -> None:
        super().__init__(CUDA_ERRORS.get(status, f"cudaError {status}"))
        self.status = status


class WouldHang(BaseException):
    """Where NCCL would wait forever (a BaseException: cleanup code suppresses Exception)."""


#: fake communicators that were destroyed because they were garbage collected (CuPy's __dealloc__)
COLLECTED: List[str] = []


class FakeComm:
    """cupy.cuda.nccl.NcclCommunicator: records each call; ``gate`` (a threading.Event) holds
    the next collective inside "NCCL" until it is set, as a blocked enqueue does;
    ``released_by_abort`` makes that gate open only when the communicator is aborted (a call
    stuck connecting to a dead peer, which only ncclCommAbort's abort flag releases)."""

    def __init__(self, rank: int = 0, size: int = 2, name: str = "comm") -> None:
        self._rank, self._size = rank, size
        self.name = name
        self.comm = 0x1234
        self.calls: list = []
        self.aborted = self.destroyed = False
        self.async_error: Optional[str] = None
        self.fail_next: Optional[BaseException] = None
        self.gate: Optional[threading.Event] = None
        self.released_by_abort = False
        self.entered = threading.Event()
        self.freed_while_inside = False
        self.split_size: Optional[int] = None
        self.abort_waits: Optional[Callable[[], None]] = None  # ncclCommAbort waits for the device
        self.fail_status: Optional[int] = None  # the next collective returns this ncclResult_t
        self.device: Optional["FakeCuda"] = None  # where the streams given to collectives run
        self.used_streams: set = set()
        self._inside = 0
        self._holding: Optional[threading.Event] = None
        #: NCCL's localPersistentRefs: plans of calls captured into CUDA graphs (multi-rank only;
        #: one rank enqueues no kernel for them), dropped when those graphs are destroyed
        self.persistent_refs = 0
        self.hung: Optional[str] = None

    def rank_id(self):
        return self._rank

    def size(self):
        return self._size

    def _record(self, name, *args):
        self._inside += 1
        try:
            self.entered.set()
            if self.gate is not None:
                gate, self.gate = self.gate, None
                self._holding = gate
                gate.wait(10)
                self._holding = None
            if not self.comm:  # ncclComm_t NULL: NCCL's argument check
                raise NcclError(NCCL_INVALID_ARGUMENT)
            if self.fail_status is not None:
                status, self.fail_status = self.fail_status, None
                raise NcclError(status)  # CuPy's check_status
            if self.fail_next is not None:
                error, self.fail_next = self.fail_next, None
                raise error
            self.calls.append((name, *args))
            if self._size > 1:  # one rank: ncclLaunchOneRank enqueues on the caller's stream, never NCCL's
                self.used_streams.add(args[-1])
            if self._size > 1 and self.device is not None and args[-1] in self.device.capturing:
                self.persistent_refs += 1  # a persistent plan: held by the graph until it is destroyed
        finally:
            self._inside -= 1

    def _one_rank_check(self, datatype, op):
        """NCCL 2.32 with one rank runs avg and PreMulSum on fp8 through a host-side scaling
        without fp8 cases: ncclInvalidArgument, before anything is enqueued."""
        if self._size == 1 and datatype in (10, 11) and op not in (0, 1, 2, 3):
            raise NcclError(NCCL_INVALID_ARGUMENT)

    @typed("intptr_t", "intptr_t", "size_t", "int", "int", "intptr_t")
    def allReduce(self, sendbuf, recvbuf, count, datatype, op, stream):  # noqa: N802 - CuPy's names
        self._one_rank_check(datatype, op)
        self._record("allReduce", sendbuf, recvbuf, count, datatype, op, stream)

    @typed("intptr_t", "intptr_t", "size_t", "int", "int", "int", "intptr_t")
    def reduce(self, sendbuf, recvbuf, count, datatype, op, root, stream):
        self._one_rank_check(datatype, op)
        self._record("reduce", sendbuf, recvbuf, count, datatype, op, root, stream)

    @typed("intptr_t", "intptr_t", "size_t", "int", "int", "intptr_t")
    def broadcast(self, sendbuff, recvbuff, count, datatype, root, stream):
        self._record("broadcast", sendbuff, recvbuff, count, datatype, root, stream)

    @typed("intptr_t", "intptr_t", "size_t", "int", "intptr_t")
    def allGather(self, sendbuf, recvbuf, count, datatype, stream):  # noqa: N802
        self._record("allGather", sendbuf, recvbuf, count, datatype, stream)

    @typed("intptr_t", "intptr_t", "size_t", "int", "int", "intptr_t")
    def reduceScatter(self, sendbuf, recvbuf, recvcount, datatype, op, stream):  # noqa: N802
        self._one_rank_check(datatype, op)
        self._record("reduceScatter", sendbuf, recvbuf, recvcount, datatype, op, stream)

    def check_async_error(self):
        if not self.comm:
            raise NcclError(NCCL_INVALID_ARGUMENT)
        if self.async_error:
            error = NcclError(6)  # ncclRemoteError
            error.args = (self.async_error,)
            raise error

    def _free(self):
        self.freed_while_inside = self.freed_while_inside or self._inside > 0
        self.comm = 0

    def _would_hang(self, what: str) -> None:
        """commDestroySync polls until every graph holding this communicator is destroyed:
        forever, from close or exit. The fake fails where the real library would hang: it notes
        it (``hung``, for calls made in threads) and raises what no ``except Exception`` swallows."""
        if self.persistent_refs:
            self.hung = f"{what} would hang: {self.persistent_refs} CUDA graph plan(s) still hold the communicator"
            raise WouldHang(self.hung)

    def _graphs_destroyed(self) -> None:
        self.persistent_refs = 0

    def abort(self):
        if not self.comm:
            return
        self._would_hang("ncclCommAbort")
        if self.abort_waits is not None:
            self.abort_waits()
        self.aborted = True
        self._free()
        if self.released_by_abort and self._holding is not None:
            self._holding.set()  # NCCL's abort flag ends the stuck connection

    def destroy(self):
        if not self.comm:
            return
        self._would_hang("ncclCommDestroy")
        if self.device is not None:  # ncclCommDestroy synchronizes with the kernels it enqueued
            self.device.wait_streams(self.used_streams)
        self.destroyed = True
        self._free()

    def __del__(self):
        if self.comm:  # CuPy's __dealloc__ destroys a communicator nobody destroyed
            COLLECTED.append(self.name)
            self.destroy()

    @typed("int", "int")
    def commSplit(self, color, key, config=None):  # noqa: N802
        self.calls.append(("commSplit", color, key))
        if color == -1:
            return None
        size = self._size if self.split_size is None else self.split_size
        return FakeComm(min(key, size - 1), size, name=f"{self.name}/split")


class FakeCuda:
    """What the transport asks of CUDA, recorded: ``module`` stands for ``cupy``.

    ``capturing``: the streams being captured into a CUDA graph; ``invalidated``: captures an
    event query broke (CUDA's global capture mode); ``broken_query``: a sticky CUDA error that
    every event query returns from then on."""

    def __init__(self, current: int = 0) -> None:
        self.current_pointer = current
        self.recorded: List[Any] = []
        self.waits: List[Any] = []
        self.capturing: set = set()
        self.invalidated: set = set()
        self.auto_done = True
        self.broken_query = False
        self.capability = "90"
        self.queries = 0
        self.capture_mode = "global"  # cudaStreamCaptureModeGlobal: torch.cuda.graph's default
        self.blocked: Dict[int, Tuple[threading.Event, float]] = {}  # stream -> host function (gate, until)
        self.alive: set = {0, current, S.pointer}  # the streams that exist (0: the legacy stream)
        world = self
        ids = itertools.count(0x100)
        events: Dict[int, Any] = {}

        def event_query(event: int) -> int:
            """cudaEventQuery: the status, never raised (runtime.eventQuery does not check it)."""
            c_argument(event, "intptr_t")
            world.queries += 1
            found = events[event]
            if found.in_capture:
                return CAPTURED_EVENT
            if world.capturing and world.capture_mode == "global":
                world.invalidated |= world.capturing  # an unsafe call during a global-mode capture
                return CAPTURE_UNSUPPORTED
            if world.broken_query:
                return ILLEGAL_ADDRESS
            if found.stream in world.blocked and not world.released(found.stream):
                return NOT_READY
            return CUDA_SUCCESS if found.finished else NOT_READY

        def stream_is_capturing(stream: int) -> bool:
            c_argument(stream, "intptr_t")
            if stream not in world.alive and stream not in world.capturing:
                raise CUDARuntimeError(INVALID_HANDLE)  # never created, or destroyed
            if stream in world.invalidated:
                raise RuntimeError("the stream was capturing, but an error has invalidated the capture sequence")
            if stream == 0 and world.capturing:
                raise CUDARuntimeError(CAPTURE_IMPLICIT)
            return stream in world.capturing

        class Event:
            def __init__(self, block=False, disable_timing=False, interprocess=False):
                self.ptr = next(ids)
                self.stream: Optional[int] = None
                self.finished = world.auto_done
                self.in_capture = False
                events[self.ptr] = self

            def record(self, stream=None):
                self.stream = 0 if stream is None else stream.ptr
                self.in_capture = self.stream in world.capturing
                world.recorded.append(self)

            @property
            def done(self):
                return world.module.cuda.runtime.eventQuery(self.ptr) == 0  # any error reads as "not done"

            def synchronize(self):
                pass

        class Stream:
            def __init__(self, null=False, non_blocking=False, ptds=False, priority=None):
                self.ptr = 0

            @classmethod
            def from_external(cls, obj):
                try:
                    version, pointer = obj.__cuda_stream__()
                except AttributeError as error:
                    raise TypeError(
                        f"Object of type {type(obj).__name__} does not implement the CUDA stream protocol"
                    ) from error
                except (TypeError, ValueError) as error:
                    raise TypeError("__cuda_stream__() must return a 2-tuple of (version, stream_ptr)") from error
                if not isinstance(version, int) or not isinstance(pointer, int):
                    raise TypeError(f"__cuda_stream__() must return (int, int), got {version!r}, {pointer!r}")
                if version != 0:
                    raise TypeError(f"__cuda_stream__() returned unsupported version {version}")
                stream = cls()
                stream.ptr = pointer
                return stream

            def wait_event(self, event):
                world.waits.append((self.ptr, event))

            def is_capturing(self):
                return world.module.cuda.runtime.streamIsCapturing(self.ptr)

        class Device:
            def __init__(self, device=None):
                self.id = device

            @property
            def compute_capability(self):
                return world.capability

            @property
            def pci_bus_id(self):
                return f"0000:{0x18 + (self.id or 0):02X}:00.0"  # cudaDeviceGetPCIBusId's form

            def use(self):
                pass

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False

        def alloc(size):
            c_argument(size, "size_t")
            return SimpleNamespace(ptr=0xBEEF)

        runtime = SimpleNamespace(
            eventQuery=event_query, streamIsCapturing=stream_is_capturing, CUDARuntimeError=CUDARuntimeError
        )
        self.module = SimpleNamespace(
            cuda=SimpleNamespace(Event=Event, Stream=Stream, Device=Device, alloc=alloc, runtime=runtime)
        )

    def block(self, stream: int, seconds: float) -> threading.Event:
        """A host function on ``stream`` (``launch_host_func``) that waits for the returned
        gate at most ``seconds``: work recorded there completes only after it."""
        gate = threading.Event()
        pointer = int(getattr(stream, "ptr", stream))
        self.alive.add(pointer)
        self.blocked[pointer] = (gate, time.monotonic() + seconds)
        return gate

    def released(self, stream: int) -> bool:
        gate, until = self.blocked[stream]
        return gate.is_set() or time.monotonic() >= until

    def wait_streams(self, streams: Any) -> None:
        """Wait until the host functions blocking ``streams`` have returned (what a
        synchronisation with work on them does)."""
        for stream in streams:
            if stream in self.blocked:
                gate, until = self.blocked[stream]
                gate.wait(max(until - time.monotonic(), 0.0))

    def wait_device(self) -> None:
        """What freeing device memory does (ncclCommAbort, cudaFree): wait until every stream's
        host functions have returned."""
        for gate, until in list(self.blocked.values()):
            gate.wait(max(until - time.monotonic(), 0.0))

    def streams(self, device: int = 0) -> CudaStreams:
        """The transport's real CUDA layer, on this fake CuPy."""
        return CudaStreams(device, cupy=self.module, current=lambda library, device: self.current_pointer)


class FakeLibrary:
    """NCCLLibrary's PreMulSum calls."""

    def __init__(self) -> None:
        self.created: list = []
        self.destroyed: list = []
        self._next = 5  # ncclNumOps: the first dynamic op

    def create_premul_sum(self, scalar, datatype, comm):
        self.created.append((scalar, datatype, comm))
        self._next += 1
        return self._next - 1

    def destroy_op(self, op, comm):
        self.destroyed.append((op, comm))


def make(*, timeout=None, size=2, version=VERSION, interval=0.01, current=0, capability="90", grace=2.0):
    """A transport on the fakes: (transport, comm, cuda, library)."""
    comm, cuda, library = FakeComm(0, size), FakeCuda(current), FakeLibrary()
    comm.device = cuda
    cuda.capability = capability
    transport = nccl.NCCLTransport(
        comm, 0, timeout=timeout, version=version, events=cuda.streams(), library=library, watchdog_interval=interval,
        abort_grace=grace,
    )
    return transport, comm, cuda, library


S = StreamRef(77, "cupy", 0)


# -- the fakes against the installed CuPy ---------------------------------------------------------


def _real_cupy():
    """The installed CuPy and its NCCL module. Skipped only where no CuPy is installed at all
    (CI installs it: test_ci_installs_cupy); one installed but broken is a failure."""
    if not any(_installed(name) for name in ("cupy-cuda12x", "cupy-cuda13x", "cupy")):
        pytest.skip("CuPy is not installed here (launch/test installs it with the cuda12 extra)")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import cupy
        from cupy.cuda import nccl as cupy_nccl
    assert cupy_nccl.available, "CuPy is installed but cannot load NCCL (is nvidia-nccl-cu12 installed?)"
    return cupy, cupy_nccl


def _installed(distribution: str) -> bool:
    from importlib import metadata

    try:
        metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return False
    return True


def test_ci_installs_cupy():
    """.ci/run and launch/test install the cuda12 extra (CuPy and NCCL, which import without a
    GPU), so the checks of the fakes against the real CuPy run in CI instead of skipping."""
    root = Path(__file__).resolve().parents[2]
    extras = re.search(r"cuda12 = \[(.*)\]", (root / "pyproject.toml").read_text()).group(1)
    assert "cupy-cuda12x" in extras and "nvidia-nccl-cu12" in extras
    assert "DENSECCL_EXTRAS=mpi,test,plot,cuda12 launch/setup" in (root / ".ci/run").read_text()
    assert 'extras="${DENSECCL_EXTRAS:-mpi,test,plot,cuda12}"' in (root / "launch/test").read_text()


def _parameters(member: Any) -> Optional[List[str]]:
    """Parameter names (without self) of a Python function, or of a Cython one from the
    signature embedded in its docstring (``Name.method(self, intptr_t sendbuf, int op=0)``)."""
    try:
        names = list(inspect.signature(member).parameters)
        if names and names[0] in ("self", "cls"):
            names = names[1:]
        if names not in (["args", "kwargs"], []) or not getattr(member, "__doc__", None):
            return names
    except (TypeError, ValueError):
        pass
    doc = getattr(member, "__doc__", None) or ""
    match = re.match(r"\s*[\w.]+\((.*?)\)", doc)
    if match is None:
        return None
    names = []
    for part in filter(None, (p.strip() for p in match.group(1).split(","))):
        name = part.split("=")[0].split()[-1].lstrip("*")
        if name not in ("self", "cls"):
            names.append(name)
    return names


def _check_against(fake: type, real: type, skip: tuple = ()) -> List[str]:
    problems = []
    for name, member in vars(fake).items():
        described = callable(member) or isinstance(member, (property, classmethod))
        if name.startswith("_") or name in skip or not described:
            continue
        if not hasattr(real, name):
            problems.append(f"{fake.__name__}.{name}: {real.__name__} has no {name}")
            continue
        real_member = inspect.getattr_static(real, name)
        if isinstance(member, property):
            if not inspect.isdatadescriptor(real_member):
                problems.append(f"{fake.__name__}.{name} is a property, {real.__name__}.{name} is not")
            continue
        if isinstance(member, classmethod):
            member, real_member = member.__func__, getattr(real, name)
        want, got = _parameters(real_member), _parameters(member)
        if want is not None and want != got:
            problems.append(f"{fake.__name__}.{name}{tuple(got or ())} != {real.__name__}.{name}{tuple(want)}")
    return problems


def test_fake_communicator_matches_cupys_ncclcommunicator():
    _, cupy_nccl = _real_cupy()
    assert _check_against(FakeComm, cupy_nccl.NcclCommunicator, skip=("comm",)) == []
    assert hasattr(cupy_nccl.NcclCommunicator, "comm")  # the raw ncclComm_t (the PreMulSum ops need it)
    wanted = _parameters(cupy_nccl.NcclCommunicator)  # the constructor, from the class docstring
    assert wanted[:3] == ["ndev", "commId", "rank"], wanted
    assert issubclass(cupy_nccl.NcclError, RuntimeError) and cupy_nccl.NcclError(4).status == 4


def test_fake_cuda_matches_cupy():
    cupy, _ = _real_cupy()
    fake = FakeCuda().module.cuda
    problems = []
    for name in ("Event", "Stream", "Device"):
        problems += _check_against(getattr(fake, name), getattr(cupy.cuda, name))
    assert problems == []
    assert _parameters(cupy.cuda.alloc) == _parameters(fake.alloc) == ["size"]
    for name in ("Event", "Stream", "Device"):  # constructors: Cython's __init__ signature or the class docstring's
        real = getattr(cupy.cuda, name)
        assert (_parameters(real.__init__) or _parameters(real)) == _parameters(getattr(fake, name).__init__), name


def test_the_transport_calls_only_what_the_fakes_offer():
    """Every attribute the transport and its CUDA layer (the modules a running communicator
    uses) take from CuPy or the communicator is one the fakes define, so the checks above cover
    everything they use."""
    from denseccl.backends.nccl import cuda, pending, transport, watchdog

    source = "".join(inspect.getsource(module) for module in (cuda, pending, transport, watchdog))
    used_comm = set(re.findall(r"self\.comm\.(\w+)", source)) | {"commSplit"}
    assert used_comm <= set(vars(FakeComm)) | {"comm"}, used_comm - set(vars(FakeComm))
    used_cuda = set(re.findall(r"cuda\.(\w+)", inspect.getsource(CudaStreams)))
    assert used_cuda <= set(vars(FakeCuda().module.cuda)) | {"ExternalStream"}, used_cuda
    used_runtime = set(re.findall(r"runtime\.(\w+)", source))
    assert used_runtime <= set(vars(FakeCuda().module.cuda.runtime)), used_runtime


def _c_types(member: Any) -> Optional[Dict[str, str]]:
    """``{parameter: C type}`` from the signature Cython embeds in a docstring, for the
    parameters that carry a C type (``intptr_t sendbuf``)."""
    doc = getattr(member, "__doc__", None) or ""
    match = re.match(r"\s*[\w.]+\((.*?)\)", doc)
    if match is None:
        return None
    found = {}
    for part in filter(None, (p.strip() for p in match.group(1).split(","))):
        words = part.split("=")[0].split()
        if len(words) == 2 and words[0] in C_RANGES:
            found[words[1]] = words[0]
    return found


def test_fake_communicator_has_cupys_c_types():
    _, cupy_nccl = _real_cupy()
    for name, member in vars(FakeComm).items():
        declared = getattr(member, "c_types", None)
        if declared is not None:
            assert declared == _c_types(getattr(cupy_nccl.NcclCommunicator, name)), name
    assert {"allReduce", "reduce", "broadcast", "allGather", "reduceScatter"} <= {
        name for name, member in vars(FakeComm).items() if hasattr(member, "c_types")
    }


BAD_ARGUMENTS = [
    ("allReduce", (0, 0, 1, 7, 0, 0)),  # valid: NCCL itself refuses the NULL communicator
    ("allReduce", (1.5, 0, 1, 7, 0, 0)),
    ("allReduce", (0, 0, -1, 7, 0, 0)),
    ("allReduce", (0, 0, 2**64, 7, 0, 0)),
    ("allReduce", (2**63, 0, 1, 7, 0, 0)),
    ("allReduce", (0, 0, 1, 7, 0, None)),
    ("allReduce", (0, 0, 1, 7, 2**31, 0)),
    ("allReduce", (0, 0, 1, 1.5, 0, 0)),
    ("reduce", (0, 0, 1, 7, 0, None, 0)),
    ("broadcast", (0, 0, -3, 7, 0, 0)),
    ("allGather", (0, 0, 1, 7, "0")),
    ("reduceScatter", (0, 0, 1, 7, 0, 3.0)),
]


def _outcome(call: Callable[[], Any]) -> str:
    try:
        call()
    except (TypeError, OverflowError) as error:
        return type(error).__name__
    except RuntimeError as error:  # NcclError: the arguments reached NCCL
        return f"NcclError {getattr(error, 'status', None)}"
    return "returned"


def test_fake_communicator_refuses_what_cupy_refuses():
    """The same arguments to CuPy's compiled NcclCommunicator (with a NULL ncclComm_t, so that
    nothing runs: NCCL answers ncclInvalidArgument once the arguments convert) and to the fake."""
    _, cupy_nccl = _real_cupy()
    real = cupy_nccl.NcclCommunicator.__new__(cupy_nccl.NcclCommunicator)
    assert real.comm == 0
    fake = FakeComm()
    fake.comm = 0  # the state of a communicator after abort or destroy
    for name, args in BAD_ARGUMENTS:
        want = _outcome(lambda: getattr(real, name)(*args))
        got = _outcome(lambda: getattr(fake, name)(*args))
        assert got == want, (name, args)
    assert _outcome(real.check_async_error) == _outcome(fake.check_async_error) == f"NcclError {NCCL_INVALID_ARGUMENT}"


def test_fake_errors_are_cupys_kinds():
    cupy, cupy_nccl = _real_cupy()
    assert issubclass(cupy_nccl.NcclError, RuntimeError) and cupy_nccl.NcclError(4).status == 4
    assert issubclass(cupy.cuda.runtime.CUDARuntimeError, RuntimeError)
    for status, text in CUDA_ERRORS.items():
        real = cupy.cuda.runtime.CUDARuntimeError(status)
        assert real.status == status and str(real).split(":")[0] == text.split(":")[0], status
    comm = FakeComm()
    comm.async_error = "remote process exited"
    with pytest.raises(NcclError, match="remote process exited"):
        comm.check_async_error()


def test_from_external_refuses_what_cupy_refuses():
    cupy, _ = _real_cupy()

    def protocol(answer):
        return type("Foreign", (), {"__cuda_stream__": lambda self: answer})()

    cases = [object(), protocol((0,)), protocol((1, 5)), protocol((0, 5.0)), protocol(None), protocol((0, 5))]
    fake = FakeCuda().module.cuda.Stream
    for obj in cases:
        want = _outcome(lambda: cupy.cuda.Stream.from_external(obj))
        assert _outcome(lambda: fake.from_external(obj)) == want, obj
    assert fake.from_external(protocol((0, 5))).ptr == cupy.cuda.Stream.from_external(protocol((0, 5))).ptr == 5


def test_fake_runtime_matches_cupy():
    cupy, _ = _real_cupy()
    fake = FakeCuda().module.cuda.runtime
    for name in ("eventQuery", "streamIsCapturing"):
        assert _parameters(getattr(cupy.cuda.runtime, name)) == _parameters(getattr(fake, name)), name
    # Event.done is runtime.eventQuery(ptr) == 0 and never raises (cupy/cuda/stream.pyx)
    assert "eventQuery" in inspect.getdoc(cupy.cuda.runtime.eventQuery)


def test_split_has_the_size_of_the_split():
    comm = FakeComm(1, 4)
    assert comm.commSplit(0, 1).size() == 4  # every rank passed the same color
    comm.split_size = 2
    part = comm.commSplit(3, 1)
    assert (part.size(), part.rank_id()) == (2, 1)
    assert comm.commSplit(-1, 0) is None
    with pytest.raises(TypeError):
        comm.commSplit(None, 0)


def test_a_collected_communicator_is_destroyed():
    before = len(COLLECTED)
    comm = FakeComm(name="dropped")
    del comm
    gc.collect()
    assert "dropped" in COLLECTED[before:]
    kept = FakeComm(name="destroyed first")
    kept.destroy()
    del kept
    gc.collect()
    assert "destroyed first" not in COLLECTED[before:]  # destroyed once, by whoever came first


@pytest.mark.parametrize("size", [1, 2])
def test_destroy_waits_only_for_the_kernels_of_multi_rank_calls(size):
    """ncclCommDestroy synchronizes NCCL's own streams: a two-rank call's kernel is behind them,
    a one-rank call (in place, out of place or PreMulSum) never is (onerank.cu)."""
    comm, cuda = FakeComm(0, size), FakeCuda()
    comm.device = cuda
    cuda.block(S.pointer, 1.0)  # the stream's work waits 1 s behind a host function
    comm.allReduce(100, 200, 8, 7, 0, S.pointer)  # out of place: a copy with one rank
    started = time.monotonic()
    comm.destroy()
    took = time.monotonic() - started
    assert comm.destroyed
    assert took < 0.5 if size == 1 else took >= 0.9, took
