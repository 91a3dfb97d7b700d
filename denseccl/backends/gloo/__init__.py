"""The gloo backend: host arrays over torch's gloo, where no MPI launcher started the job.

Why it exists: torchrun, ``torch.multiprocessing.spawn`` and env:// launches have no MPI, yet
their ranks hold host arrays of every layout too. gloo is correct on flat contiguous 1-D
tensors, and a span is exactly that, so the same core (layout rule, agreement, errors) runs on
gloo with one gloo call per collective. :mod:`.init` (the set-up) meets on a torch key-value
store; :mod:`.transport` holds the transport and the control channel, each on a gloo group of
its own; :mod:`.held` keeps the tensors gloo was given until its threads let go of them. gloo's
wait blocks inside the library (its threads move the data), so where the ranks share a host the
transport hands its small calls to the shared-memory engine (denseccl/backends/shm), which moves
them through the board's data area.
torch is imported only when a communicator is made.
"""
