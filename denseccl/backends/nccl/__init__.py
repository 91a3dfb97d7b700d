"""The NCCL backend: collectives on GPU memory through ``cupy.cuda.nccl`` (docs/nccl.md).

Everything that knows NCCL or CUDA lives in this package, so the core (layouts, agreement,
flow) holds no device code. Two modules, split where a running communicator begins:

- :mod:`.init`: what is known before one runs, all tested without a GPU: can NCCL run here,
  how the ranks of a launch meet and which GPU each drives (``init_nccl``), what NCCL of each
  version can do (dtype and op tables), and the ctypes binding of the calls CuPy lacks;
- :mod:`.transport`: a communicator at work: ``NCCLTransport`` (one NCCL call per collective),
  CUDA events, streams and graph capture, the pending call, the watchdog, and the thread rules
  of abort, close and retire.

Two and not one because the first half is data and choices a reader checks without a device,
the second the device work and its failure modes; CuPy is imported only when ``init_nccl`` runs.
"""
