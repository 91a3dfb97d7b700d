"""The fakes that stand for CuPy and its NcclCommunicator in the CPU tests of the NCCL transport,
and the tests that keep them honest: every method and property a fake offers exists in the
installed CuPy with the same parameters (read from the signatures Cython embeds in CuPy's
docstrings), so a fake cannot drift from the library it stands for.

``FakeComm`` records the NCCL calls; ``FakeCuda`` is a stand-in for the ``cupy`` module (Event,
Stream.from_external, Device, alloc) that records events, stream waits and captures, and raises
as CUDA does when an event recorded during a capture is queried.
"""

from __future__ import annotations

import inspect
import itertools
import re
import threading
import warnings
from types import SimpleNamespace
from typing import Any, List, Optional

import pytest

from denseccl.streams import StreamRef
from denseccl.transports import nccl
from denseccl.transports.nccl_events import CudaStreams
from denseccl.transports.nccl_tables import version_code

VERSION = version_code(2, 27, 3)


class FakeComm:
    """cupy.cuda.nccl.NcclCommunicator: records each call; ``gate`` (a threading.Event) holds
    the next collective inside "NCCL" until it is set, as a blocked enqueue does."""

    def __init__(self, rank: int = 0, size: int = 2) -> None:
        self._rank, self._size = rank, size
        self.comm = 0x1234
        self.calls: list = []
        self.aborted = self.destroyed = False
        self.async_error: Optional[str] = None
        self.fail_next: Optional[BaseException] = None
        self.gate: Optional[threading.Event] = None
        self.entered = threading.Event()
        self.freed_while_inside = False
        self._inside = 0

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
                gate.wait(10)
            if self.fail_next is not None:
                error, self.fail_next = self.fail_next, None
                raise error
            self.calls.append((name, *args))
        finally:
            self._inside -= 1

    def _one_rank_check(self, datatype, op):
        """NCCL 2.32 with one rank runs avg and PreMulSum on fp8 through a host-side scaling
        without fp8 cases: ncclInvalidArgument, before anything is enqueued."""
        if self._size == 1 and datatype in (10, 11) and op not in (0, 1, 2, 3):
            raise NcclError(4)

    def allReduce(self, sendbuf, recvbuf, count, datatype, op, stream):  # noqa: N802 - CuPy's names
        self._one_rank_check(datatype, op)
        self._record("allReduce", sendbuf, recvbuf, count, datatype, op, stream)

    def reduce(self, sendbuf, recvbuf, count, datatype, op, root, stream):
        self._one_rank_check(datatype, op)
        self._record("reduce", sendbuf, recvbuf, count, datatype, op, root, stream)

    def broadcast(self, sendbuff, recvbuff, count, datatype, root, stream):
        self._record("broadcast", sendbuff, recvbuff, count, datatype, root, stream)

    def allGather(self, sendbuf, recvbuf, count, datatype, stream):  # noqa: N802
        self._record("allGather", sendbuf, recvbuf, count, datatype, stream)

    def reduceScatter(self, sendbuf, recvbuf, recvcount, datatype, op, stream):  # noqa: N802
        self._one_rank_check(datatype, op)
        self._record("reduceScatter", sendbuf, recvbuf, recvcount, datatype, op, stream)

    def check_async_error(self):
        if self.async_error:
            raise RuntimeError(self.async_error)

    def _free(self):
        self.freed_while_inside = self.freed_while_inside or self._inside > 0
        self.comm = 0

    def abort(self):
        self.aborted = True
        self._free()

    def destroy(self):
        self.destroyed = True
        self._free()

    def commSplit(self, color, key, config=None):  # noqa: N802
        self.calls.append(("commSplit", color, key))
        return None if color == -1 else FakeComm(0, 1)


class NcclError(RuntimeError):
    """cupy.cuda.nccl.NcclError: the status travels as ``.status``."""

    def __init__(self, status: int) -> None:
        super().__init__(f"NCCL error {status}")
        self.status = status


class FakeCuda:
    """What the transport asks of CUDA, recorded: ``module`` stands for ``cupy``."""

    def __init__(self, current: int = 0) -> None:
        self.current_pointer = current
        self.recorded: List[Any] = []
        self.waits: List[Any] = []
        self.capturing: set = set()
        self.auto_done = True
        self.broken_query = False
        self.capability = "90"
        self.queries = 0
        world = self
        ids = itertools.count(0x100)

        class Event:
            def __init__(self, block=False, disable_timing=False, interprocess=False):
                self.ptr = next(ids)
                self.stream: Optional[int] = None
                self.finished = world.auto_done
                self.in_capture = False

            def record(self, stream=None):
                self.stream = 0 if stream is None else stream.ptr
                self.in_capture = self.stream in world.capturing
                world.recorded.append(self)

            @property
            def done(self):
                world.queries += 1
                if self.in_capture:
                    raise RuntimeError(
                        "cudaErrorCapturedEvent: operation not permitted on an event last recorded in a capture"
                    )
                if world.broken_query:
                    raise RuntimeError("cudaErrorIllegalAddress: an illegal memory access was encountered")
                return self.finished

            def synchronize(self):
                pass

        class Stream:
            def __init__(self, null=False, non_blocking=False, ptds=False, priority=None):
                self.ptr = 0

            @classmethod
            def from_external(cls, obj):
                stream = cls()
                stream.ptr = obj.__cuda_stream__()[1]
                return stream

            def wait_event(self, event):
                world.waits.append((self.ptr, event))

            def is_capturing(self):
                return self.ptr in world.capturing

        class Device:
            def __init__(self, device=None):
                self.id = device

            @property
            def compute_capability(self):
                return world.capability

            def use(self):
                pass

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False

        def alloc(size):
            return SimpleNamespace(ptr=0xBEEF)

        self.module = SimpleNamespace(cuda=SimpleNamespace(Event=Event, Stream=Stream, Device=Device, alloc=alloc))

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


def make(*, timeout=None, size=2, version=VERSION, interval=0.01, current=0, capability="90"):
    """A transport on the fakes: (transport, comm, cuda, library)."""
    comm, cuda, library = FakeComm(0, size), FakeCuda(current), FakeLibrary()
    cuda.capability = capability
    transport = nccl.NCCLTransport(
        comm, 0, timeout=timeout, version=version, events=cuda.streams(), library=library, watchdog_interval=interval
    )
    return transport, comm, cuda, library


S = StreamRef(77, "cupy", 0)


# -- the fakes against the installed CuPy ---------------------------------------------------------


def _real_cupy():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            import cupy
            from cupy.cuda import nccl as cupy_nccl
        except Exception as error:  # noqa: BLE001
            pytest.skip(f"CuPy is not importable here: {error}")
    return cupy, cupy_nccl


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
    """Every attribute the transport and its CUDA layer take from CuPy or the communicator is
    one the fakes define, so the checks above cover everything they use."""
    import denseccl.transports.nccl as transport_module
    import denseccl.transports.nccl_events as events_module

    used_comm = set(re.findall(r"self\.comm\.(\w+)", inspect.getsource(transport_module))) | {"commSplit"}
    assert used_comm <= set(vars(FakeComm)) | {"comm"}, used_comm - set(vars(FakeComm))
    used_cuda = set(re.findall(r"cuda\.(\w+)", inspect.getsource(events_module.CudaStreams)))
    assert used_cuda <= set(vars(FakeCuda().module.cuda)) | {"ExternalStream"}, used_cuda
