"""Rank program: one rank passes an object whose array protocol raises, is malformed or gives
a NULL data pointer. That rank must raise a LayoutError naming the object, every other rank a
MismatchError; no buffer is written; the communicator stays usable. Each kind of object is
passed in turn by each rank, to allreduce (whose good ranks replay a plan after the first
round), broadcast and allgather.

usage: mpiexec -n N python protocol_errors.py
"""

from __future__ import annotations

import numpy as np

import denseccl
from tests.mpi.ranks.common import Checker
from tests.support.protocols import (
    ArrayInterface,
    CudaInterface,
    NullDLPack,
    RaisingArrayInterface,
    RaisingCudaInterface,
    RaisingDLPack,
    null_interface,
)

BAD = {
    "raising __array_interface__": lambda: RaisingArrayInterface(),
    "NULL __array_interface__": lambda: ArrayInterface(interface=null_interface(4)),
    "raising __cuda_array_interface__": lambda: RaisingCudaInterface(),
    "NULL __cuda_array_interface__": lambda: CudaInterface(null_interface(4)),
    "raising __dlpack__": lambda: RaisingDLPack(),
    "NULL __dlpack__": lambda: NullDLPack(4),
}
CALLS = {
    "allreduce": lambda comm, x: comm.allreduce(x),
    "broadcast": lambda comm, x: comm.broadcast(x, root=0),
    "allgather": lambda comm, x: comm.allgather(x),
}

comm = denseccl.init(backend="mpi", timeout=20)
rank, size = comm.rank, comm.size
checker = Checker("protocol-errors", rank, size)
for round_ in range(2):
    for kind, make in BAD.items():
        for collective, call in CALLS.items():
            for culprit in range(size):
                mine = np.full(4, float(rank + 1))
                x = make() if rank == culprit else mine
                where = f"{collective} with a {kind} on rank {culprit}"
                try:
                    call(comm, x)
                except denseccl.LayoutError as error:
                    checker.check(rank == culprit, f"{where}: a LayoutError on a good rank: {error}")
                    text = str(error)
                    checker.check(
                        type(x).__qualname__ in text and kind.split()[1] in text,
                        f"{where}: the error does not name the object and protocol: {text}",
                    )
                except denseccl.MismatchError as error:
                    checker.check(rank != culprit, f"{where}: MismatchError on the culprit: {error}")
                    checker.check("mismatch" in str(error), f"{where}: {error}")
                except Exception as error:  # noqa: BLE001
                    checker.fail(f"{where}: {type(error).__name__}: {error}")
                else:
                    checker.fail(f"{where}: no error")
                checker.check(np.array_equal(mine, np.full(4, float(rank + 1))), f"{where}: a buffer was written")
                checker.check(comm.broken is None, f"{where}: the communicator broke: {comm.broken}")
                good = np.full(4, float(rank + 1))
                comm.allreduce(good)
                checker.check(
                    np.array_equal(good, np.full(4, size * (size + 1) / 2)), f"after {where}: wrong sum {good}"
                )
comm.close()
checker.finish()
