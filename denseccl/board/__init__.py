"""The shared-memory agreement board, whichever library provides its page (docs/design.md).

- :mod:`.board`: the protocol (``Board.all_equal``, the "gave up" flag), over a page and a fence;
- :mod:`.doorbell`: futexes in the host's page where crowded ranks sleep;
- :mod:`.cores`: whether a host's ranks can each have a core (affinity masks, cgroup quotas).

Under an MPI launch the MPI library provides the page (backends/mpi/shared.py). Nothing here
imports MPI, torch or a GPU library.
"""
