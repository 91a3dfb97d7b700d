"""Every ``DENSECCL_*`` setting, the tuning constants, and the facts about launchers that
several modules need.

:func:`settings` parses the environment with one rule per kind (booleans, seconds, words) and
caches the result for as long as the environment holds the same values; explicit arguments
(``denseccl.init(check=..., timeout=...)``) win over it. docs/api.md lists the variables.
:func:`seconds` is the one conversion for timeouts given as numbers or ``datetime.timedelta``.
"""

from __future__ import annotations

import datetime
import os
import tempfile
from dataclasses import dataclass, fields
from functools import lru_cache
from typing import Any, Callable, Mapping, Optional, Tuple, Union

from .errors import DenseCCLError

#: seconds a rank waits for its peers unless told otherwise
DEFAULT_TIMEOUT = 300.0
#: calls each communicator's flight recorder keeps unless told otherwise (recorder.py); its cost
#: per call is measured in docs/debugging.md
DEFAULT_TRACE_BUFFER = 1024
#: bytes up to which a call of the gloo engine's ranks on one host moves through the host's
#: shared memory instead of gloo (backends/shm); each rank's slot holds this much twice over,
#: in one segment per communicator
DEFAULT_HOST_PATH = 65536

# -- tuning: every constant that trades latency, memory or politeness, in one place ----------

#: polls of a transfer or an MPI agreement before a wait computes its deadline or gives the core
#: up (uncrowded hosts): a peer on another core answers a small call within these
SPINS = 64
#: reads of a peer's board line before the agreement's wait yields (about 1 ms; uncrowded only)
BOARD_SPINS = 20000
#: polls per turn of a crowded wait before it gives the core up: MPICH's small allreduce needs a
#: few progress calls after the peer delivered (2 to 4 measured alike on one core, 1 ~25% slower)
CROWDED_BURST = 3
#: turns of a crowded wait before it computes its deadline (2 sent most repeated 4 KiB calls
#: into the full wait, about 6% slower)
CROWDED_TURNS = 3
#: yields of a crowded wait before it sleeps on its doorbell: an idle shared core answers within
#: one or two; a longer wait is for a stalled peer or a busy core, where sleeping is faster
CROWDED_YIELDS = 8
#: turns of a long wait between two reads of the clock (the deadline)
CLOCK_TURNS = 32
#: an uncrowded wait that has yielded this long starts sleeping :data:`SLEEP_SECONDS` a turn
SLEEP_AFTER_SECONDS = 0.05
SLEEP_SECONDS = 0.0002
#: the longest a rank asleep on its doorbell goes without testing (a missed wake-up costs this)
NAP_SECONDS = 0.0002
#: a wait that has lasted this long is for a stopped or busy peer: from then on it sleeps
#: :data:`IDLE_SECONDS` between tests, or :data:`IDLE_NAP_SECONDS` on its doorbell where the
#: host has them (a ring ends that sleep at once), so that a stopped peer costs under 1% of a core
IDLE_AFTER_SECONDS = 1.0
#: a wait that blocks in a library (gloo's) returns this often to hear whether a peer gave up;
#: a round with no news of its own (gloo's, a store's) reads it from the store at most this often
WATCH_SECONDS = 0.5
IDLE_SECONDS = 0.01
IDLE_NAP_SECONDS = 0.05
#: prepared calls kept per communicator (the cache of repeated geometries) before it starts over
PREPARED_CALLS = 512
#: persistent MPI requests kept per communicator (the oldest is freed past this)
PERSISTENT_REQUESTS = 64
#: a float16/bfloat16 MPI allreduce of at least this many bytes, waited for at once, runs as
#: reduce-scatter + allgather (backends/mpi/transport.py)
SPLIT_HALVES_BYTES = 1 << 20
#: how long a rank that gives up drives MPI to deliver its "gave up" notes before it raises
NOTE_PUSH_SECONDS = 0.2
#: the longest single blocking wait on a key-value store; the deadline is checked between waits
STORE_WAIT_SLICE = 30.0
#: a point-to-point message of at most this many bytes goes with its header in one message,
#: through a copy on each side (cheaper than a second message below it; torch/p2p.py)
P2P_ONE_MESSAGE_BYTES = 1 << 16
#: NCCL PreMulSum ops kept per NCCL communicator (one per factor and dtype); past this the least
#: recently used is destroyed once the calls given it have returned
PREMUL_CACHE = 64
#: seconds an NCCL abort waits for a call inside NCCL to return before aborting under it
ABORT_GRACE = 2.0
#: seconds a rank that ends the job (DENSECCL_ON_TIMEOUT=abort) leaves its launcher to forward
#: what it printed before MPI_Abort: MPICH's hydra acts on the abort first under load and drops
#: the rank's last output (1 job in 10 with both cores busy)
ABORT_PRINT_SECONDS = 0.3
#: elements per chunk of the host float16/bfloat16 kernels: amortises NumPy's per-call cost, and
#: the chunk's scratch stays in L2
HOST_KERNEL_CHUNK = 1 << 15
#: seconds between two event queries of the NCCL watchdog: how late it sees a finished call
WATCHDOG_INTERVAL = 0.02
#: the torch progress thread yields instead of sleeping this long after an operation was
#: submitted or completed, so that a burst of transfers completes with low latency
PROGRESS_SPIN_SECONDS = 5e-3
#: then it sleeps this long between polls (``DENSECCL_TORCH_POLL`` overrides it), leaving the
#: core to the backward pass the transfers overlap with
PROGRESS_POLL_SECONDS = 50e-6
#: and ten times as long once nothing happened for this many seconds
PROGRESS_QUIET_SECONDS = 0.1

#: variables an MPI launcher (mpiexec/mpirun of MPICH or Open MPI, srun with PMI/PMIx) sets
MPI_LAUNCH_VARIABLES = (
    "PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALNRANKS",
)

#: the port of srun's zero-configuration rendezvous (backends/slurm.py): base + (job id mod JOBS)
#: * STEPS + (step id mod STEPS), in 15000-24999 as Lightning's (below Linux's ephemeral ports)
SLURM_PORT_BASE, SLURM_PORT_JOBS, SLURM_PORT_STEPS = 15000, 1000, 10

#: variables that carry a process's rank on its host, most specific first
LOCAL_RANK_VARIABLES = ("LOCAL_RANK", "MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID")

_TRUE = frozenset({"1", "on", "true", "yes", "always"})
_FALSE = frozenset({"0", "off", "false", "no", "never"})
_KERNELS = ("auto", "native", "torch", "numpy")
_DEBUG = ("WARN", "INFO", "TRACE")
#: what a rank does when a peer never joins: raise CollectiveTimeoutError (and tell the peers),
#: or abort the whole job (MPI_Abort), as MPI's default error handler does
ON_TIMEOUT = ("raise", "abort")
_WAITS = ("auto", "spin", "yield")

Seconds = Union[None, int, float, datetime.timedelta]


@dataclass(frozen=True)
class Settings:
    """The parsed ``DENSECCL_*`` environment (None: not set)."""

    backend: Optional[str]
    check: bool
    timeout: Optional[float]
    shared_agreement: bool
    host_kernels: str
    torch_poll: Optional[float]
    debug: str
    on_timeout: str
    wait: str
    trace_buffer: int
    trace_dir: Optional[str]
    host_path: int


#: the variables, in the order of the fields of :class:`Settings` they set
_NAMES = tuple(f"DENSECCL_{field.name.upper()}" for field in fields(Settings))


def flag(word: Union[bool, str], what: str) -> bool:
    """The one rule for booleans: 1/on/true/yes/always and 0/off/false/no/never."""
    if isinstance(word, bool):
        return word
    text = str(word).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise DenseCCLError(f"{what} must be 'always' or 'off' (or on/off, 1/0, true/false, yes/no), got {word!r}")


def seconds(value: Any, what: str) -> Optional[float]:
    """A timeout given as seconds (number or numeric string) or a ``datetime.timedelta``, as
    float seconds; None stays None. Negative values are refused."""
    if value is None:
        return None
    if isinstance(value, datetime.timedelta):
        number = value.total_seconds()
    else:
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise DenseCCLError(f"{what} must be a number of seconds or a datetime.timedelta, got {value!r}") from None
    if number < 0 or number != number:
        raise DenseCCLError(f"{what} must be >= 0 seconds (0 waits forever), got {value!r}")
    return number


def timeout(value: Seconds = None) -> Optional[float]:
    """The timeout a communicator uses: ``value`` if given, else ``DENSECCL_TIMEOUT``, else
    :data:`DEFAULT_TIMEOUT`; 0 means wait forever (None)."""
    chosen = seconds(value, "timeout")
    if chosen is None:
        chosen = settings().timeout
    return (DEFAULT_TIMEOUT if chosen is None else chosen) or None


def settings(environ: Optional[Mapping[str, str]] = None) -> Settings:
    """The ``DENSECCL_*`` settings of ``environ`` (default ``os.environ``), parsed once per
    distinct set of values."""
    source = os.environ if environ is None else environ
    return _parse(tuple(source.get(name) for name in _NAMES))


@lru_cache(maxsize=8)
def _parse(raw: Tuple[Optional[str], ...]) -> Settings:
    values = dict(zip(_NAMES, raw))
    backend = values["DENSECCL_BACKEND"]
    if backend is not None:
        backend = backend.strip().lower() or None
    debug = (values["DENSECCL_DEBUG"] or "WARN").strip().upper()
    return Settings(
        backend=backend,
        check=flag(values["DENSECCL_CHECK"] or "always", "DENSECCL_CHECK"),
        timeout=_seconds_or_none(values["DENSECCL_TIMEOUT"], "DENSECCL_TIMEOUT"),
        shared_agreement=flag(values["DENSECCL_SHARED_AGREEMENT"] or "1", "DENSECCL_SHARED_AGREEMENT"),
        host_kernels=_word(values["DENSECCL_HOST_KERNELS"] or "auto", _KERNELS, "DENSECCL_HOST_KERNELS"),
        torch_poll=_seconds_or_none(values["DENSECCL_TORCH_POLL"], "DENSECCL_TORCH_POLL"),
        debug=_word("WARN" if debug == "WARNING" else debug, _DEBUG, "DENSECCL_DEBUG", str.upper),
        on_timeout=_word(values["DENSECCL_ON_TIMEOUT"] or "raise", ON_TIMEOUT, "DENSECCL_ON_TIMEOUT"),
        wait=_word(values["DENSECCL_WAIT"] or "auto", _WAITS, "DENSECCL_WAIT"),
        trace_buffer=_count(values["DENSECCL_TRACE_BUFFER"], DEFAULT_TRACE_BUFFER, "DENSECCL_TRACE_BUFFER"),
        trace_dir=(values["DENSECCL_TRACE_DIR"] or "").strip() or None,
        host_path=_count(values["DENSECCL_HOST_PATH"], DEFAULT_HOST_PATH, "DENSECCL_HOST_PATH"),
    )


def _count(raw: Optional[str], default: int, name: str) -> int:
    if raw is None or not raw.strip():
        return default
    text = raw.strip()
    if not text.isdigit():
        raise DenseCCLError(f"{name} must be a whole number >= 0 (0 turns it off), got {raw!r}")
    return int(text)


def trace_dir() -> str:
    """The folder whose job folders hold flight recorder dumps (trace_files.py):
    ``DENSECCL_TRACE_DIR``, else the per-user ``denseccl-trace-<uid>`` in the temporary
    directory (``TMPDIR``, else /tmp)."""
    return settings().trace_dir or os.path.join(tempfile.gettempdir(), f"denseccl-trace-{os.geteuid()}")


def _word(raw: str, words: Tuple[str, ...], what: str, case: Callable[[str], str] = str.lower) -> str:
    """``raw`` as one of ``words`` (stripped, in their ``case``); else :class:`DenseCCLError`."""
    word = case(raw.strip())
    if word not in words:
        raise DenseCCLError(f"{what} must be one of {', '.join(words)}, got {raw!r}")
    return word


def on_timeout(value: Optional[str] = None) -> str:
    """What a timeout does: ``value`` if given (``denseccl.init(on_timeout=...)``), else
    ``DENSECCL_ON_TIMEOUT``, else ``"raise"``."""
    return settings().on_timeout if value is None else _word(str(value), ON_TIMEOUT, "on_timeout")


def _seconds_or_none(raw: Optional[str], name: str) -> Optional[float]:
    if raw is None or not raw.strip():
        return None
    return seconds(raw.strip(), name)


def launched_by_mpi(environ: Optional[Mapping[str, str]] = None) -> bool:
    """Whether an MPI launcher (mpiexec, mpirun, srun with PMI/PMIx) started this process."""
    source = os.environ if environ is None else environ
    return any(source.get(name) for name in MPI_LAUNCH_VARIABLES)


def local_rank(environ: Optional[Mapping[str, str]] = None) -> Optional[int]:
    """This process's rank on its host, from the first launcher variable that holds one."""
    source = os.environ if environ is None else environ
    for name in LOCAL_RANK_VARIABLES:
        raw = source.get(name)
        if raw is not None and raw.strip().lstrip("-").isdigit():
            return int(raw)
    return None


__all__ = [
    "DEFAULT_TIMEOUT",
    "DEFAULT_TRACE_BUFFER",
    "LOCAL_RANK_VARIABLES",
    "MPI_LAUNCH_VARIABLES",
    "Settings",
    "flag",
    "launched_by_mpi",
    "local_rank",
    "on_timeout",
    "seconds",
    "settings",
    "timeout",
    "trace_dir",
]
