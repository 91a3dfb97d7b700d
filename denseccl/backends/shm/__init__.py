"""The shared-memory engine: collectives of ranks that share one host, through the data area of
their agreement board (denseccl/channel/board.py), ordered by the board's steps.

Why an engine of its own: gloo has no shared-memory transport, so under torchrun a small call
of two ranks on one host is a TCP round through gloo's threads (about 1 ms here), where MPI
moves it through shared memory in microseconds. The board is shared memory already, and its
agreement step is the barrier such a call needs. This engine is written against the core's
interfaces alone (denseccl/transport.py: ``Transport``, ``Pending``, ``Start``); the gloo
engine hands it the calls that fit (backends/gloo/transport.py), and it hands back to gloo
(its ``fallback``) whatever does not, or wherever the step says that not every rank is on it.

- :mod:`.area`: the data area's slots, the reductions in rank order;
- :mod:`.repeated`: a repeated in-place allreduce, reduce or broadcast (``Transport.prepare``);
- :mod:`.first`: every other call but all-to-all (``Transport.once``: a barrier, an allgather,
  a reduce-scatter; a first, out-of-place or async allreduce, reduce or broadcast), its data
  moved within the call's agreement step;
- :mod:`.transport`: ``ShmTransport``, the engine, and which calls fit.
"""
