"""One rank per GPU, checked on every rank before NCCL is touched.

Why: NCCL refuses two ranks of one host on one GPU ("Duplicate GPU detected", printed only with
``NCCL_DEBUG=WARN``) and every rank then dies with a bare ``ncclInvalidUsage``. The usual first
try on a one-GPU machine (``torchrun --nproc-per-node 2``, ``mpiexec -n 2``) does exactly that.
Before the communicator is made, every rank sends the identity of its GPU (the host as NCCL
knows it, and the device's PCI bus id) over the control channel; every rank sees the same list,
so every rank raises the same error, which says what to do.

NCCL's host identity (``getHostHash``): ``NCCL_HOSTID`` when set, else the host name and the
kernel's boot id. Two ranks with different ``NCCL_HOSTID`` s look like two hosts to NCCL, which
then connects them over sockets even on one GPU: allowed here, for tests only.
"""

from __future__ import annotations

import os
import socket
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ...errors import DenseCCLError

BOOT_ID = "/proc/sys/kernel/random/boot_id"


def host_identity(environ: Optional[Mapping[str, str]] = None, boot_id_path: str = BOOT_ID) -> str:
    """The host as NCCL tells hosts apart: ``NCCL_HOSTID``, else host name + boot id."""
    source = os.environ if environ is None else environ
    given = source.get("NCCL_HOSTID")
    if given:
        return f"NCCL_HOSTID={given}"
    try:
        with open(boot_id_path, encoding="ascii") as file:
            boot = file.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}" if boot else socket.gethostname()


def device_identity(cupy: Any, device: int, environ: Optional[Mapping[str, str]] = None) -> bytes:
    """``host|pci bus id|ordinal`` of this rank's GPU, what NCCL compares between ranks."""
    bus = str(cupy.cuda.Device(device).pci_bus_id).lower()
    return f"{host_identity(environ)}|{bus}|{device}".encode()


def shared_devices(identities: Sequence[bytes]) -> List[Tuple[str, str, int, List[int]]]:
    """``(host, bus id, ordinal, ranks)`` for each GPU that more than one rank would drive."""
    ranks: Dict[Tuple[str, str], List[int]] = {}
    ordinals: Dict[Tuple[str, str], int] = {}
    for rank, raw in enumerate(identities):
        host, bus, ordinal = raw.decode().rsplit("|", 2)
        ranks.setdefault((host, bus), []).append(rank)
        ordinals.setdefault((host, bus), int(ordinal))
    return [(host, bus, ordinals[host, bus], held) for (host, bus), held in ranks.items() if len(held) > 1]


def shared_device_message(shared: Sequence[Tuple[str, str, int, List[int]]], size: int) -> str:
    """The one error every rank raises: which ranks share which GPU, and what to do."""
    parts = [
        f"ranks {', '.join(map(str, held))} on host {host.split('/')[0]} would drive one GPU (device {ordinal}, "
        f"PCI {bus})"
        for host, bus, ordinal, held in shared
    ]
    return (
        f"the nccl backend runs one rank per GPU, and {'; '.join(parts)}: NCCL refuses that (Duplicate GPU detected). "
        f"Start as many ranks per host as it has GPUs (torchrun --nproc-per-node=<GPUs per host>, mpiexec with "
        f"that many ranks per host) instead of {size}, or give each rank its own GPU (CUDA_VISIBLE_DEVICES, "
        "init(device=...)); for CPU tensors use backend='mpi' or 'gloo'. For tests only: ranks on one GPU can "
        "meet over sockets when each has its own NCCL_HOSTID (with NCCL_SOCKET_IFNAME=lo), slowly"
    )


def check_one_rank_per_device(control: Any, identity: bytes, deadline: Optional[float]) -> None:
    """Raise :class:`DenseCCLError` on every rank when two ranks would drive one GPU
    (collective over ``control``, one allgather of a few bytes)."""
    identities = list(control.allgather_bytes(identity, deadline))
    shared = shared_devices(identities)
    if shared:
        raise DenseCCLError(shared_device_message(shared, len(identities)))


__all__ = ["check_one_rank_per_device", "device_identity", "host_identity", "shared_device_message", "shared_devices"]
