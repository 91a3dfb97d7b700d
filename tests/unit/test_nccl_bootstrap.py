"""NCCL bootstrap without a GPU: the unique id in both CuPy forms, device and launch choice,
backend selection, and the clear error that says what is missing and how to install it."""

from __future__ import annotations

import sys
import types
import warnings

import pytest

import denseccl
from denseccl import bootstrap, config
from denseccl.backends.nccl import init as nccl_bootstrap
from denseccl.errors import DenseCCLError
from tests.support.optional import needs_mpi4py

RAW = bytes(range(128))


# -- the unique id --------------------------------------------------------------------------------


def test_unique_id_forms_round_trip():
    signed = nccl_bootstrap.unique_id_tuple(RAW)
    assert len(signed) == 128 and min(signed) >= -128 and max(signed) <= 127
    assert signed[127] == 127 and nccl_bootstrap.unique_id_tuple(bytes([200]) * 128)[0] == 200 - 256
    assert nccl_bootstrap.unique_id_bytes(signed) == RAW  # CuPy 13: tuple of signed chars
    assert nccl_bootstrap.unique_id_bytes(RAW) == RAW  # CuPy 14: bytes
    assert nccl_bootstrap.unique_id_bytes(list(RAW)) == RAW  # unsigned ints too
    assert nccl_bootstrap.unique_id_bytes(bytearray(RAW)) == RAW
    with pytest.raises(DenseCCLError, match="128"):
        nccl_bootstrap.unique_id_bytes(b"short")
    with pytest.raises(DenseCCLError, match="not an NCCL unique id"):
        nccl_bootstrap.unique_id_bytes(3.5)


def test_cupy_version_decides_the_form():
    assert nccl_bootstrap.cupy_wants_bytes("14.0.1") and nccl_bootstrap.cupy_wants_bytes("15.0.0a1")
    assert not nccl_bootstrap.cupy_wants_bytes("13.6.0") and not nccl_bootstrap.cupy_wants_bytes("12.3.0")


class _TypedFactory:
    """Like CuPy's NcclCommunicator: the id argument is typed (bytes or tuple)."""

    def __init__(self, accepted):
        self.accepted = accepted
        self.seen = []

    def __call__(self, ndev, commId, rank):
        self.seen.append(type(commId))
        if not isinstance(commId, self.accepted):
            raise TypeError(f"Argument 'commId' has incorrect type (expected {self.accepted.__name__})")
        return (ndev, commId, rank)


@pytest.mark.parametrize("accepted, version", [(bytes, "14.2.0"), (tuple, "13.6.0")])
def test_make_communicator_passes_the_form_this_cupy_takes(accepted, version):
    factory = _TypedFactory(accepted)
    size, unique_id, rank = nccl_bootstrap.make_communicator(factory, 4, RAW, 2, version)
    assert (size, rank) == (4, 2) and isinstance(unique_id, accepted) and factory.seen == [accepted]
    assert nccl_bootstrap.unique_id_bytes(unique_id) == RAW


def test_make_communicator_does_not_retry_a_type_error():
    """A TypeError is CuPy's answer to a wrong form: it is raised, not answered with another form."""
    factory = _TypedFactory(tuple)
    with pytest.raises(TypeError, match="commId"):
        nccl_bootstrap.make_communicator(factory, 4, RAW, 2, "14.2.0")
    assert factory.seen == [bytes]


def test_real_unique_id_when_nccl_is_installed():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        nccl = pytest.importorskip("cupy.cuda.nccl")
    if not getattr(nccl, "available", False):
        pytest.skip("no libnccl")
    assert len(nccl_bootstrap.unique_id_bytes(nccl.get_unique_id())) == 128  # needs no GPU


# -- device and launch ---------------------------------------------------------------------------


def test_local_rank_and_device():
    assert config.local_rank({"LOCAL_RANK": "3"}) == 3
    assert config.local_rank({"MPI_LOCALRANKID": "1"}) == 1
    assert config.local_rank({"OMPI_COMM_WORLD_LOCAL_RANK": "2"}) == 2
    assert config.local_rank({"LOCAL_RANK": "x"}) is None
    assert config.local_rank({}) is None
    assert nccl_bootstrap.pick_device(5, 9, 4) == 1
    assert nccl_bootstrap.pick_device(None, 9, 4) == 1
    assert nccl_bootstrap.pick_device(1, 1, 1) == 0  # two ranks may share one GPU (NCCL_HOSTID trick)
    with pytest.raises(DenseCCLError, match="no CUDA device"):
        nccl_bootstrap.pick_device(0, 0, 0)


def test_launch_kind():
    torchrun = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    assert nccl_bootstrap.launch_kind(store=object(), environ={}) == "store"
    assert nccl_bootstrap.launch_kind(comm=object(), environ=torchrun) == "mpi"
    assert nccl_bootstrap.launch_kind(environ=torchrun) == "env"
    assert nccl_bootstrap.launch_kind(size=1, environ=torchrun) == "solo"
    assert nccl_bootstrap.launch_kind(environ={"PMI_RANK": "0"}) == "mpi"
    assert nccl_bootstrap.launch_kind(environ={"RANK": "0"}) == "mpi"  # incomplete torchrun env
    with pytest.raises(DenseCCLError, match="store="):
        nccl_bootstrap.launch_kind(size=2, environ={})


# -- is NCCL usable, and backend selection -----------------------------------------------------


def _fake_cupy(monkeypatch, *, gpu, nccl_available):
    """A CuPy that says ``gpu`` and ``nccl_available``, with its compiled NCCL extension
    (``cupy_backends.cuda.libs.nccl``) importable, whether or not the real CuPy is installed."""
    for name in ("cupy_backends", "cupy_backends.cuda", "cupy_backends.cuda.libs", "cupy_backends.cuda.libs.nccl"):
        module = types.ModuleType(name)
        module.__path__ = []  # a package, so that its submodules import
        monkeypatch.setitem(sys.modules, name, module)
    cupy = types.ModuleType("cupy")
    cupy.__version__ = "14.2.0"
    cupy.is_available = lambda: gpu
    cuda = types.ModuleType("cupy.cuda")
    nccl = types.ModuleType("cupy.cuda.nccl")
    nccl.available = nccl_available
    cupy.cuda = cuda
    cuda.nccl = nccl
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setitem(sys.modules, "cupy.cuda", cuda)
    monkeypatch.setitem(sys.modules, "cupy.cuda.nccl", nccl)


def test_missing_cupy(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy -> ImportError
    message = nccl_bootstrap.nccl_missing()
    assert "CuPy" in message and "not installed" in message and "pip install 'denseccl[cuda1" in message
    assert not nccl_bootstrap.nccl_usable()
    with pytest.raises(DenseCCLError, match=r"denseccl\[cuda1[23]\]"):
        denseccl.init(backend="nccl")


def test_no_gpu_and_no_nccl(monkeypatch):
    _fake_cupy(monkeypatch, gpu=False, nccl_available=False)
    message = nccl_bootstrap.nccl_missing()
    assert "no CUDA GPU is visible" in message and "libnccl.so.2" in message and "nvidia-nccl-cu12" in message
    assert "pip install 'denseccl[cuda1" in message and "backend='mpi'" in message


def test_gpu_without_nccl(monkeypatch):
    _fake_cupy(monkeypatch, gpu=True, nccl_available=False)
    message = nccl_bootstrap.nccl_missing()
    assert "no CUDA GPU" not in message and "libnccl.so.2" in message


class _RefusedImport:
    """A meta path finder that makes importing ``name`` fail with ``error`` (what the dynamic
    linker says when CuPy's NCCL extension cannot load)."""

    def __init__(self, name, error):
        self.name, self.error = name, error

    def find_spec(self, fullname, path=None, target=None):
        if fullname == self.name:
            raise self.error
        return None


@pytest.mark.parametrize(
    ("error", "says", "not_said"),
    [
        (
            ImportError("/x/nccl.cpython-311-x86_64-linux-gnu.so: undefined symbol: ncclCommShrink"),
            ["older than this CuPy needs", "undefined symbol: ncclCommShrink", "LD_LIBRARY_PATH"],
            "cannot load the NCCL library",
        ),
        (ImportError("libnccl.so.2: cannot open shared object file"), ["pip install nvidia-nccl-cu12"], "older"),
    ],
)
def test_nccl_extension_that_cannot_load_says_why(monkeypatch, error, says, not_said):
    _fake_cupy(monkeypatch, gpu=True, nccl_available=False)
    monkeypatch.delitem(sys.modules, "cupy_backends.cuda.libs.nccl", raising=False)
    monkeypatch.setattr(sys, "meta_path", [_RefusedImport("cupy_backends.cuda.libs.nccl", error), *sys.meta_path])
    message = nccl_bootstrap.nccl_missing()
    assert all(part in message for part in says) and not_said not in message, message


def test_everything_present(monkeypatch):
    _fake_cupy(monkeypatch, gpu=True, nccl_available=True)
    assert nccl_bootstrap.nccl_missing() is None and nccl_bootstrap.nccl_usable()


def test_default_backend(monkeypatch):
    monkeypatch.setattr(nccl_bootstrap, "nccl_usable", lambda: True)
    assert bootstrap._default_backend() == "nccl"
    monkeypatch.setattr(nccl_bootstrap, "nccl_usable", lambda: False)
    assert bootstrap._default_backend() == "mpi"


@needs_mpi4py
def test_init_without_backend_picks_mpi_here(monkeypatch):
    monkeypatch.delenv("DENSECCL_BACKEND", raising=False)
    monkeypatch.setattr(nccl_bootstrap, "nccl_usable", lambda: False)
    communicator = denseccl.init(timeout=10)
    try:
        assert communicator.backend == "mpi"
    finally:
        communicator.close()


def test_asking_for_nccl_on_this_machine_says_what_is_missing():
    if nccl_bootstrap.nccl_usable():
        pytest.skip("this machine can run NCCL")
    with pytest.raises(DenseCCLError) as raised:
        denseccl.init(backend="nccl")
    text = str(raised.value)
    assert "pip install 'denseccl[cuda1" in text
    assert "CuPy" in text or "GPU" in text or "NCCL" in text


def test_env_backend(monkeypatch):
    monkeypatch.setenv("DENSECCL_BACKEND", "nccl")
    monkeypatch.setattr(nccl_bootstrap, "nccl_missing", lambda: "the nccl backend cannot run here: test")
    with pytest.raises(DenseCCLError, match="cannot run here: test"):
        denseccl.init()


def test_unknown_options(monkeypatch):
    monkeypatch.setattr(nccl_bootstrap, "nccl_missing", lambda: None)
    with pytest.raises(DenseCCLError, match=r"unexpected options for the nccl backend: bogus \(known: store, rank"):
        denseccl.init(backend="nccl", bogus=1)
    with pytest.raises(DenseCCLError, match=r"unexpected options for the gloo backend: bogus, device \(known: store"):
        denseccl.init(backend="gloo", bogus=1, device=0)
