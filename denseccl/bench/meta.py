"""What a result depends on besides the numbers: versions, hosts, ranks per host, the CPUs each
rank may use. The header prints it and the JSON records it, so that two runs can be compared
knowing what differed."""

from __future__ import annotations

import os
import socket
from collections import Counter, OrderedDict
from typing import Any, Dict, List, Optional, Sequence

from .. import config
from ..envreport import compress, versions
from .options import pin_cpus


def pin(spec: Optional[str]) -> Optional[str]:
    """Apply ``--pin`` to this process (call it before MPI starts, so that every thread MPI or
    torch creates later inherits the mask). Returns what went wrong, or None."""
    if not spec:
        return None
    if not hasattr(os, "sched_setaffinity"):
        return "--pin needs os.sched_setaffinity (Linux)"
    local = config.local_rank()
    if local is None and spec.strip().lower() == "core":
        return ("--pin core needs the rank's local rank (MPI_LOCALRANKID, OMPI_COMM_WORLD_LOCAL_RANK, ...): "
                "start it with mpiexec")
    try:
        os.sched_setaffinity(0, pin_cpus(spec, affinity(), local or 0))
    except (ValueError, OSError) as error:
        return str(error)
    return None


def affinity() -> List[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:
        return list(range(os.cpu_count() or 1))


def gather(world: Any) -> Dict[str, Any]:
    """Collective: every rank's host and CPUs -> hosts, ranks per host and affinity per rank."""
    mine = (socket.gethostname(), compress(affinity()))
    everyone: Sequence[Any] = world.allgather(mine)
    hosts = list(OrderedDict.fromkeys(host for host, _ in everyone))
    per_host = Counter(host for host, _ in everyone)
    counts = sorted(set(per_host.values()))
    return {
        "hosts": len(hosts),
        "host_names": hosts,
        "ranks_per_host": counts[0] if len(counts) == 1 else {host: per_host[host] for host in hosts},
        "affinity": [cpus for _, cpus in everyone],
        "cpu_count": os.cpu_count(),
    }


def version_info() -> "OrderedDict[str, str]":
    """Versions without importing anything new (see envreport.versions)."""
    found = versions(load=False)
    for name in ("python", "matplotlib", "ml_dtypes"):
        found.pop(name, None)
    return found


def header_lines(info: Dict[str, Any], found: Dict[str, str], pinned: Optional[str]) -> List[str]:
    """The header's lines on versions, hosts and CPUs."""
    lines = ["#  versions: " + "  ".join(f"{name} {value}" for name, value in found.items() if name != "MPI library")]
    lines.append(f"#  MPI library: {found.get('MPI library', '?')}")
    per_host = info["ranks_per_host"]
    spread = per_host if isinstance(per_host, int) else ", ".join(f"{h}: {n}" for h, n in per_host.items())
    lines.append(f"#  hosts {info['hosts']} ({', '.join(info['host_names'])})  ranks per host {spread}")
    cpus = info["affinity"]
    how = f" (--pin {pinned})" if pinned else ""
    if len(set(cpus)) == 1:
        lines.append(f"#  cpus: every rank may use {cpus[0]} of {info['cpu_count']}{how}")
    else:
        lines.append("#  cpus: " + ", ".join(f"rank {r} on {c}" for r, c in enumerate(cpus)) + how)
    return lines
