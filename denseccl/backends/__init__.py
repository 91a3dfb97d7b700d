"""The backends: what moves the bytes, and the small host channel the ranks agree on.

The core (communicator.py, flow.py, agreement.py, wait.py) knows layouts and the order of a
call's steps but no library; a backend knows one library and no layouts, behind the interface
of denseccl/transport.py. Each backend is a package holding its set-up (how the ranks of a launch
meet, returning the transport and the control channel the core builds its Communicator on), its
transport and its control channel: :mod:`.mpi` (mpi4py on host memory, the default under
an MPI launcher), :mod:`.gloo` (torch's gloo on host memory, for launches without MPI) and
:mod:`.nccl` (NCCL through CuPy on device memory). Shared by several: :mod:`.store` (a control
channel over a key-value store) and :mod:`.rendezvous` (meeting on a store without MPI);
denseccl/bootstrap chooses one and builds the Communicator.
"""
