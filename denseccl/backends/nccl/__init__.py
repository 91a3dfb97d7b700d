"""The NCCL backend: collectives on GPU memory through ``cupy.cuda.nccl`` (docs/nccl.md).

Everything that knows NCCL or CUDA lives in this package, so the core (layouts, agreement,
flow) holds no device code. Four modules, imported one way only (init -> transport ->
tables, library; no circle):

- :mod:`.tables`: what NCCL of each version can do (dtype, op and result tables, version
  gates, PreMulSum scalars), read by both of the next two; pure data, tested without a GPU;
- :mod:`.library`: the ctypes binding of the few libnccl calls CuPy lacks;
- :mod:`.init`: what is known before a communicator runs: can NCCL run here, how the ranks of
  a launch meet and which GPU each drives (``init_nccl``);
- :mod:`.transport`: a communicator at work: ``NCCLTransport`` (one NCCL call per collective),
  CUDA events, streams and graph capture, the pending call, the watchdog, and the thread rules
  of abort, close and retire.

CuPy is imported only when ``init_nccl`` runs.
"""
