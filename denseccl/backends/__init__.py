"""The backends: what moves the bytes, and the small host channel the ranks agree on.

The core (communicator.py, flow.py, agreement.py, wait.py) knows layouts and the order of a
call's steps but no library; a backend knows one library and no layouts. Between them stands
the interface of :mod:`.base`. Each backend is a package holding its init (how the ranks of a
launch meet and what the library needs), its transport and its control channel:

- :mod:`.mpi`: mpi4py on host memory, the default under an MPI launcher; its control channel
  uses a shared-memory board where every rank shares the host, and it detects whether the
  host's ranks share cores (the wait policy, wait.py);
- :mod:`.gloo`: torch's gloo on host memory, for launches without MPI (torchrun, spawn);
- :mod:`.nccl`: NCCL through CuPy on device memory (one GPU per rank).

Shared by several: :mod:`.store` (a control channel over a key-value store) and
:mod:`.rendezvous` (how ranks meet on a store without MPI). denseccl/bootstrap only chooses.
"""
