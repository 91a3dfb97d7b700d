"""The MPI backend: host arrays over mpi4py, the default under an MPI launcher.

Why a backend of its own: MPI is where denseccl runs most (mpiexec, srun), and its per-call
cost is the smallest, so what surrounds each call matters most here. Everything that only
makes sense with an MPI library underneath lives in this package: the set-up (:mod:`.init`), the
transport (:mod:`.transport`) with the float16/bfloat16 reductions MPI cannot do
(:mod:`.host_kernels`) and the persistent requests of repeated calls, paired by a tag
(:mod:`.persistent`; nothing outside this package knows tags), the control channel
(:mod:`.control`) on MPI, or on the shared-memory board (denseccl/channel/) where the ranks
share a host, and the compiled half loops (``_half_kernels.c``, beside their one user).

Nothing here is imported before a communicator asks for MPI: importing mpi4py initialises MPI.
"""
