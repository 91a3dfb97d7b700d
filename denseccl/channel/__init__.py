"""The shared-memory agreement board, whichever library provides its page (docs/design.md).

- :mod:`.board`: the protocol (``Board.all_equal``, the "gave up" flag), over a page and a fence;
- :mod:`.doorbell`: futexes in the host's page where crowded ranks sleep;
- :mod:`.cores`: whether a host's ranks can each have a core (affinity masks, cgroup quotas);
- :mod:`.fence`: the memory fence of a page no MPI library orders (compiled ``denseccl._fence``);
- :mod:`.segment`: a page without MPI, in /dev/shm only until every rank has mapped it;
- :mod:`.hosts`: which ranks share a host, and their page, set up over a control channel;
- :mod:`.control`: the control channel of ranks that met on a store (gloo engine, NCCL path).

Under an MPI launch the MPI library provides the page (backends/mpi/shared.py). Nothing here
imports MPI, torch or a GPU library.
"""
