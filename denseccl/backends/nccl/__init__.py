"""The NCCL backend: collectives on GPU memory through ``cupy.cuda.nccl`` (docs/nccl.md).

Everything that knows NCCL or CUDA lives in this package, so the core (layouts, agreement,
flow) holds no device code. Its modules import one way only (init -> transport -> the
rest; no circle):

- :mod:`.tables`: what NCCL of each version can do (dtype, op and result tables, version
  gates, PreMulSum scalars), read by the set-up and the transport; pure data, tested without a
  GPU;
- :mod:`.library`: the ctypes binding of the few libnccl calls CuPy lacks;
- :mod:`.advice`: which extra (``denseccl[cuda12]`` or ``[cuda13]``) installs the GPU stack here;
- :mod:`.placement`: one rank per GPU, checked on every rank before NCCL is touched;
- :mod:`.init`: the set-up, what is known before a communicator runs: can NCCL run here, how
  the ranks of a launch meet and which GPU each drives (``init_nccl``, which returns the
  transport and the control channel);
- :mod:`.transport`: a communicator at work: ``NCCLTransport`` (one NCCL call per collective)
  and the thread rules of abort, close and retire; its helpers :mod:`.cuda` (events, streams,
  the capture gate), :mod:`.watchdog` (verdicts on eager calls) and :mod:`.pending` (the
  enqueued call and its waits).

CuPy is imported only when ``init_nccl`` runs.
"""
