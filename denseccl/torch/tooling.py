"""What torch's tooling asks of a process group besides its collectives, answered for the
denseccl group (docs/torch.md, In torch's tooling): the device types it serves and its backend
for each (torch chooses devices and probes capabilities by them), and the sequence number of
its calls (torch's debug tooling pairs calls across ranks by it), which is the flight
recorder's (:mod:`denseccl.recorder`).
"""

from __future__ import annotations

from typing import Any, List

import torch

from ..communicator import Communicator

#: the device types of the tensors the backend moves
DEVICE_TYPES = ("cpu", "cuda")


class TorchTooling:
    """Mixin of :class:`~.process_group.ProcessGroupDenseCCL`; the group provides
    :meth:`_live_host`."""

    def _live_host(self) -> Communicator:
        raise NotImplementedError

    # -- the group's backends, as torch asks for them ----------------------------------------

    #: the device types the group serves; torch reads them where it chooses a device for a
    #: group (object collectives, checkpointing), as it reads a built-in group's backends
    @property
    def _device_types(self) -> List[torch.device]:
        return [torch.device(kind) for kind in DEVICE_TYPES]

    def _get_backend(self, device: Any) -> "TorchTooling":
        """The group itself, for cpu and cuda: it is its own backend on both (torch's Python
        code asks a group's backend what it supports, below)."""
        kind = torch.device(device).type
        if kind not in DEVICE_TYPES:
            raise RuntimeError(
                f"No backend type associated with device type {kind}: "
                f"the denseccl backend serves {', '.join(DEVICE_TYPES)}"
            )
        return self

    # what torch asks of a backend: denseccl has no splitting, no NCCL-style coalescing of
    # send/recv, no tensor allocator and no time estimator
    supports_splitting = False
    supports_coalescing = False
    supports_time_estimate = False
    supports_shrinking = False

    def supports_tensor_alloc(self, device: Any) -> bool:
        return False

    # -- sequence numbers ----------------------------------------------------------------------

    def _get_sequence_number_for_group(self) -> int:
        """How many calls this group's CPU communicator has numbered: the sequence its flight
        recorder gives the next call (every call of the group takes one, the same on every rank
        that makes the same calls). CUDA calls are numbered by the NCCL communicator's own
        recorder (``Communicator.dump_trace``), as torch numbers a group by its default backend."""
        recorder = self._live_host().flow.recorder
        if recorder is None:
            raise RuntimeError(
                "denseccl numbers a group's calls in its flight recorder, which DENSECCL_TRACE_BUFFER=0 turns off; "
                "set DENSECCL_TRACE_BUFFER to the number of calls to keep (e.g. 2000)"
            )
        return recorder.count

    def _set_sequence_number_for_group(self) -> None:
        """Nothing to agree on: every rank's numbering starts at 0 when the group is created."""


__all__ = ["DEVICE_TYPES", "TorchTooling"]
