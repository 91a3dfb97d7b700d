"""The gloo backend: host arrays over torch's gloo, where no MPI launcher started the job.

Why it exists: torchrun, ``torch.multiprocessing.spawn`` and env:// launches have no MPI, yet
their ranks hold host arrays of every layout too. gloo is correct on flat contiguous 1-D
tensors, and a span is exactly that, so the same core (layout rule, agreement, errors) runs
on gloo with one gloo call per collective.

- :mod:`.init`: the ranks meet on a torch key-value store (``store=``, or the env:// store of
  a torchrun-style launch) and make two gloo groups;
- :mod:`.transport`: the transport on the first group and the control channel on the second,
  so that the agreement step never queues behind a large transfer.

gloo's wait blocks inside the library (its threads move the data), so gloo calls are never
prepared for the polling fast path: each runs the general path (``Transport.prepare`` is None).
Importing this package needs torch only when a communicator is made.
"""
