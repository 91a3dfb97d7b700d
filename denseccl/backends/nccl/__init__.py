"""The NCCL backend: collectives on GPU memory through ``cupy.cuda.nccl``.

Why a package of its own: everything that knows about NCCL and CUDA lives here and nowhere
else, so the core engine (layouts, agreement, flow) stays free of device code, and the whole
GPU path can be read, reviewed and tested on the CPU in three modules:

- :mod:`.transport`: :class:`~.transport.NCCLTransport`, one NCCL call per collective on a
  storage span and a CUDA stream, and the thread rules of abort, close and retire;
- :mod:`.cuda`: CUDA events, stream waits and capture checks through CuPy's own objects, the
  pending call (``Work.wait`` orders a stream, ``synchronize`` blocks the host) and the watchdog;
- :mod:`.library`: what NCCL of each version can do (dtype and op tables, version gates,
  PreMulSum scalars) and the ctypes binding of the libnccl C API that CuPy does not wrap.

Three modules, not two, because the transport and its CUDA side are each near the ~400-line
limit of a file with one job. How a rank finds its GPU and the NCCL unique id is the bootstrap's
(:mod:`denseccl.bootstrap.nccl`); nothing here imports CuPy until a transport is made.
"""
