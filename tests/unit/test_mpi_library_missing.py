"""mpi4py installed without an MPI library (its ABI wheels on a machine with no MPI): importing
``mpi4py.MPI`` raises RuntimeError("cannot load MPI library"), not ImportError. Every path that
needs MPI must turn that into the install hint ``denseccl[mpi]``, and none may quietly make a
world of one out of a launch of many ranks."""

from __future__ import annotations

import sys
import types

import pytest

import denseccl
from denseccl import envreport
from denseccl.backends.nccl import init as nccl_bootstrap
from denseccl.errors import DenseCCLError

#: what mpi4py 4's loader raises (mpi4py/_mpiabi.py): the first line, then one per path tried
LOAD_ERROR = "cannot load MPI library\nlibmpi.so.12: cannot open shared object file: No such file or directory"
LAUNCH_VARIABLES = ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                    "MPI_LOCALNRANKS", "WORLD_SIZE", "SLURM_STEP_NUM_TASKS", "RANK", "MASTER_ADDR", "MASTER_PORT")


class _LoadFails:
    """A meta path finder under which ``import mpi4py.MPI`` raises mpi4py's RuntimeError."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname == "mpi4py.MPI":
            raise RuntimeError(LOAD_ERROR)
        return None


@pytest.fixture()
def no_mpi_library(monkeypatch):
    """mpi4py present, its MPI library absent, and no launcher in the environment."""
    package = types.ModuleType("mpi4py")
    package.__path__ = []  # a package without MPI loaded yet, whether or not the real one was imported
    monkeypatch.setitem(sys.modules, "mpi4py", package)
    monkeypatch.delitem(sys.modules, "mpi4py.MPI", raising=False)
    monkeypatch.setattr(sys, "meta_path", [_LoadFails(), *sys.meta_path])
    for name in LAUNCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("DENSECCL_BACKEND", raising=False)
    with pytest.raises(RuntimeError, match="cannot load MPI library"):
        from mpi4py import MPI  # noqa: F401 - the fake does what mpi4py does
    return monkeypatch


def _says_install(error: BaseException) -> None:
    text = str(error)
    assert isinstance(error, DenseCCLError), repr(error)
    assert "pip install 'denseccl[mpi]'" in text and "cannot load MPI library" in text, text
    assert "libmpi.so.12" in text and "\n" not in text, text  # the paths tried, on one line


def test_init_mpi_says_how_to_install(no_mpi_library):
    with pytest.raises(DenseCCLError) as raised:
        denseccl.init(backend="mpi", timeout=5)
    _says_install(raised.value)


def test_default_init_without_gpu_says_how_to_install(no_mpi_library):
    no_mpi_library.setattr(nccl_bootstrap, "nccl_usable", lambda: False)
    with pytest.raises(DenseCCLError) as raised:
        denseccl.init(timeout=5)
    _says_install(raised.value)


def test_nccl_under_an_mpi_launcher_says_how_to_install(no_mpi_library):
    no_mpi_library.setenv("PMI_RANK", "1")
    with pytest.raises(DenseCCLError) as raised:
        nccl_bootstrap._mpi_world()
    assert "pip install 'denseccl[mpi]'" in str(raised.value) and "cannot load MPI library" in str(raised.value)


@pytest.mark.parametrize("variable", ["WORLD_SIZE", "SLURM_STEP_NUM_TASKS"])
def test_nccl_never_makes_a_world_of_one_from_a_launch_of_two(no_mpi_library, variable):
    """No MPI, no torchrun address, but a launcher said two tasks: one rank alone would return
    its own input from every collective."""
    no_mpi_library.setenv(variable, "2")
    with pytest.raises(DenseCCLError, match=f"{variable}=2"):
        nccl_bootstrap._mpi_world()


def test_nccl_alone_is_one_rank(no_mpi_library):
    assert nccl_bootstrap._mpi_world() is None  # plain ``python script.py``: one rank, as MPI's singleton


def test_environment_report_says_how_to_install(no_mpi_library):
    usable, text = envreport._mpi_status()
    assert not usable and "pip install 'denseccl[mpi]'" in text and "cannot load MPI library" in text, text


def test_torch_under_mpiexec_says_how_to_install(no_mpi_library):
    pytest.importorskip("torch.distributed")
    from denseccl.torch import _launch

    no_mpi_library.setenv("PMI_RANK", "0")
    for call in (_launch.host_engine, _launch.launcher_place, lambda: _launch.mpi_group(0, 2, [])):
        with pytest.raises(DenseCCLError) as raised:
            call()
        _says_install(raised.value)
