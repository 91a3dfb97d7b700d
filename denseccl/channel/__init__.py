"""The control channel: the agreement step and the "a peer gave up" news, and the shared-memory
board through which the ranks of one host take that step (docs/design.md).

- :mod:`.base`: the channel's interface and the step's answers;
- :mod:`.shared`: ``SharedControl``, the one board channel, wrapping any round (MPI's, gloo's,
  a store's); ``open_shared``, the one set-up every launch takes;
- :mod:`.board`: the protocol (``Board.all_equal``, the "gave up" flag), over a page and a fence;
- :mod:`.hosts`: which ranks share a host, and their page, set up over the round;
- :mod:`.segment`: the page, a memfd handed over a Unix socket, with no name anywhere;
- :mod:`.doorbell`: futexes in the host's page where crowded ranks sleep;
- :mod:`.cores`: whether a host's ranks can each have a core (affinity masks, cgroup quotas);
- :mod:`.fence`: the page's memory fence (compiled ``denseccl._fence``).

The rounds themselves are the backends' (backends/mpi/control.py, backends/gloo/transport.py,
backends/store.py). Nothing here imports MPI, torch or a GPU library.
"""
