"""denseccl's device backends, one package each (:mod:`.nccl`). A backend brings the transport
of one library: the thin layer that turns (pointer, count, dtype, op, root, stream) into one
library call, what the library can do as data, and how its work is watched. Host transports
(MPI, gloo) and the shared base live in :mod:`denseccl.transports`."""
