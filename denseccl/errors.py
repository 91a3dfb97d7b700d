"""The errors denseccl raises. Every one derives from :class:`DenseCCLError`."""

from __future__ import annotations

from typing import Optional


class DenseCCLError(Exception):
    """Base of every denseccl error."""


class LayoutError(DenseCCLError, ValueError):
    """A local problem with an array's layout: not dense, ``out`` has another layout, a
    malformed stacked buffer, a read-only buffer, an array or dtype denseccl cannot read.
    Nothing was touched."""


class OpError(DenseCCLError, ValueError):
    """A local problem with the reduction op: not one denseccl supports (an unknown name,
    torch's ``ReduceOp.BAND``, mpi4py's ``MPI.LAND`` …; the message lists the supported ops),
    not defined for the dtype (``min`` on complex numbers), or a ``PreMulSum`` factor that is
    not finite or does not fit an integer dtype, or an op NCCL cannot run (a complex product, avg
    or PreMulSum on an NCCL too old for it). Nothing was touched."""


class ArgumentError(DenseCCLError, ValueError):
    """A local problem with an argument that is not a layout or an op: a root that is not a
    rank, a split colour that is not a non-negative int, an array in the wrong memory for the
    transport (host vs device, another GPU), a dtype the transport cannot move or reduce (the
    gloo engine's and NCCL's limits), a stream that is not a CUDA stream or cannot be used
    during a CUDA-graph capture, arguments NCCL itself refuses, and in the torch backend a list
    of the wrong length, a tensor count a call does not take or all-to-all split sizes that do
    not add up. Nothing was touched."""


class MismatchError(DenseCCLError, RuntimeError):
    """Ranks disagree on collective, root, op, dtype, shape or layout (or a peer's input was
    invalid). Raised on every rank; no buffer was touched and the communicator stays usable."""


class CollectiveTimeoutError(DenseCCLError, TimeoutError):
    """A peer never joined within the timeout. The communicator is marked broken afterwards."""


class CommunicatorBrokenError(DenseCCLError, RuntimeError):
    """The communicator cannot be used any more (after a timeout or a transport failure)."""


def timeout_error(what: str, seen: str = "") -> CollectiveTimeoutError:
    """What a wait for ``what`` raises once its deadline has passed (``seen``: what the wait
    saw of the missing peers, such as missing store keys or the library's message)."""
    return CollectiveTimeoutError(
        f"{what} did not complete within the timeout: a peer never joined (it may have crashed, be stuck, or have "
        f"called a different sequence of collectives{seen and '; ' + seen}). The communicator is now broken; raise "
        "the timeout with denseccl.init(timeout=...) or DENSECCL_TIMEOUT if peers are just slow"
    )


def peer_gave_up_error(rank: Optional[int]) -> CommunicatorBrokenError:
    """What a rank raises once it knows that ``rank`` gave up on a call of their communicator."""
    return CommunicatorBrokenError(
        f"rank {rank} gave up on a collective of this communicator (it timed out, was interrupted or failed), "
        "so no call that pairs with it "
        "may complete; this communicator is unusable: create a new one with denseccl.init()"
    )
