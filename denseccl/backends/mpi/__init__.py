"""The MPI backend: host arrays over mpi4py, the default under an MPI launcher.

Why a backend of its own: MPI is where denseccl runs most (mpiexec, srun), and it is the
library whose per-call cost is smallest, so what surrounds each call matters most here. The
package holds everything that only makes sense with an MPI library underneath:

- :mod:`.init`: the ranks of a launch (or a given mpi4py communicator) duplicate it twice,
  nonblocking, so that a peer that never calls init makes the others time out;
- :mod:`.transport`: one ``MPI_I*`` call per collective on a flat view of the span, with what
  MPI lacks supplied around it (half-precision reductions, avg, PreMulSum);
- :mod:`.calls`: repeated in-place calls on persistent requests the ranks pair in the
  agreement step by a tag (nothing outside this package knows tags);
- :mod:`.control`: the agreement step, on its own communicator or on :mod:`.board` (a shared
  page when every rank shares the host), and the "gave up" notes;
- :mod:`.cores`: whether the host's ranks can each have a core (affinity masks, cgroup
  quotas), which sets the process's wait policy (wait.py), and :mod:`.doorbell`, where
  crowded ranks sleep;
- :mod:`.host_kernels`: the float16/bfloat16 reductions MPI cannot do.

Nothing here is imported before a communicator asks for MPI: mpi4py initialises MPI when it
is imported.
"""
