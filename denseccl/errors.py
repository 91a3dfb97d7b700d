"""The errors denseccl raises. Every one derives from :class:`DenseCCLError`."""

from __future__ import annotations

from typing import Optional


class DenseCCLError(Exception):
    """Base of every denseccl error."""


class LayoutError(DenseCCLError, ValueError):
    """A local input problem: not dense, ``out`` has another layout, malformed stacked buffer,
    unsupported dtype or op, read-only buffer, root out of range. Nothing was touched."""


class OpError(DenseCCLError, ValueError):
    """A local input problem: the reduction op is not one denseccl supports (an unknown name,
    torch's ``ReduceOp.BAND``, mpi4py's ``MPI.LAND`` …). The message lists the supported ops.
    Nothing was touched."""


class MismatchError(DenseCCLError, RuntimeError):
    """Ranks disagree on collective, root, op, dtype, shape or layout (or a peer's input was
    invalid). Raised on every rank; no buffer was touched and the communicator stays usable."""


class CollectiveTimeoutError(DenseCCLError, TimeoutError):
    """A peer never joined within the timeout. The communicator is marked broken afterwards."""


class CommunicatorBrokenError(DenseCCLError, RuntimeError):
    """The communicator cannot be used any more (after a timeout or a transport failure)."""


def peer_gave_up_error(rank: Optional[int]) -> CommunicatorBrokenError:
    """What a rank raises once it knows that ``rank`` gave up on a call of their communicator."""
    return CommunicatorBrokenError(
        f"rank {rank} gave up on a collective of this communicator (it timed out), so no call that pairs with it "
        "may complete; this communicator is unusable: create a new one with denseccl.init()"
    )
