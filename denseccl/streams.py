"""Which CUDA stream a device collective runs on, and telling torch's caching allocator about it.

A collective runs on the stream the caller gives (``stream=``) or else on the array's current
stream, torch's for torch tensors and CuPy's otherwise, so that it is ordered after the kernels
that produced its data with no host synchronisation.
"""

from __future__ import annotations

import sys
import threading
import weakref
from functools import lru_cache
from typing import Any, Dict, NamedTuple

from .arrays import HOST, Buffer
from .errors import ArgumentError


class StreamRef(NamedTuple):
    """The CUDA stream a device collective runs on, and whose *current* stream ``Work.wait()``
    should order after it: ``library`` is ``"torch"`` for torch tensors (torch's current
    stream), else ``"cupy"`` (CuPy's current stream)."""

    pointer: int
    library: str
    device: int
    #: the caller's stream object behind ``pointer`` (torch tensors only), kept alive by
    #: :func:`record_stream` as long as the tensors recorded on it (None: a bare handle, or a
    #: stream torch owns)
    owner: Any = None


def current_stream_pointer(library: str, device: int) -> int:
    """The ``cudaStream_t`` that ``library`` (``"torch"`` or ``"cupy"``) treats as current on
    ``device`` right now (0 is the legacy default stream)."""
    if library == "torch":
        torch = sys.modules["torch"]
        return int(torch.cuda.current_stream(device).cuda_stream)
    import cupy  # noqa: PLC0415 - device arrays only

    try:
        return int(cupy.cuda.get_current_stream(device).ptr)
    except TypeError:  # a CuPy whose get_current_stream takes no device
        with cupy.cuda.Device(device):
            return int(cupy.cuda.get_current_stream().ptr)


def stream_pointer(stream: Any) -> int:
    """The ``cudaStream_t`` of a stream given by the user: an int handle, a CuPy stream
    (``.ptr``), a torch stream (``.cuda_stream``) or any object with ``__cuda_stream__``."""
    if isinstance(stream, bool):
        raise ArgumentError(f"stream={stream!r} is not a CUDA stream")
    if isinstance(stream, int):
        return stream
    protocol = getattr(stream, "__cuda_stream__", None)
    if protocol is not None:
        _version, handle = protocol() if callable(protocol) else protocol
        return int(handle)
    for attribute in ("ptr", "cuda_stream"):
        value = getattr(stream, attribute, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    raise ArgumentError(
        f"stream={stream!r} is not a CUDA stream: pass a cupy.cuda.Stream, a torch.cuda.Stream, an object "
        "with __cuda_stream__, an integer cudaStream_t, or None for the array's current stream"
    )


def current_stream(buffer: Buffer, stream: Any = None) -> StreamRef:
    """The stream a device collective on ``buffer`` runs on: ``stream`` if given, else the
    array's current stream (for a ``__cuda_array_interface__`` object, its ``stream`` entry if
    it names one, else CuPy's current stream)."""
    library = "torch" if buffer.library == "torch" else "cupy"
    if stream is not None:
        owner = stream if library == "torch" and not isinstance(stream, int) else None
        return StreamRef(stream_pointer(stream), library, buffer.device, owner)
    if buffer.library == "cuda_array_interface":
        named = getattr(buffer.owner, "__cuda_array_interface__", {}).get("stream")
        if isinstance(named, int) and not isinstance(named, bool) and named > 0:
            # 1 is cudaStreamLegacy, the stream that handle 0 names in CuPy, torch and NCCL
            return StreamRef(0 if named == 1 else named, library, buffer.device)
    return StreamRef(current_stream_pointer(library, buffer.device), library, buffer.device)


@lru_cache(maxsize=256)  # streams come and go: keep the cache bounded
def _torch_stream(pointer: int, device: int) -> Any:
    """torch's view of the stream ``pointer`` on ``device`` (which it does not own). Handle 0
    is the legacy default stream, torch's own default stream: ``ExternalStream(0)`` would be a
    new stream from torch's pool (a null pointer there means "none given")."""
    cuda = sys.modules["torch"].cuda
    if pointer == 0:
        return cuda.default_stream(device)
    return cuda.ExternalStream(pointer, device=device)


def record_stream(ref: Any, keep: Any) -> None:
    """Tell torch's caching allocator that the CUDA tensors among ``keep`` (a Buffer or a tuple
    of them) are used by work on stream ``ref``, as ProcessGroupNCCL does: a tensor freed after
    ``Work.wait()`` (which orders only the caller's current stream) is then not handed out
    again before that work is done. Other libraries: nothing."""
    if not isinstance(ref, StreamRef) or ref.library != "torch":
        return
    stream = _torch_stream(ref.pointer, ref.device)
    seen = None
    for buffer in (keep,) if isinstance(keep, Buffer) else keep:
        if not isinstance(buffer, Buffer) or buffer.library != "torch" or buffer.device == HOST:
            continue
        if buffer.owner is not seen:
            buffer.owner.record_stream(stream)
            if ref.owner is not None:
                _pin(buffer.owner, ref.owner)
            seen = buffer.owner  # in place: the input is the output


#: storage -> the stream objects its tensors were recorded on, by id: torch's allocator records
#: an event on each of those streams when the storage is freed, which fails ("invalid resource
#: handle") on a stream destroyed before (a CuPy stream the caller let go), so they live as long
_PINNED: "weakref.WeakKeyDictionary[Any, Dict[int, Any]]" = weakref.WeakKeyDictionary()
_PINNED_LOCK = threading.Lock()


def _pin(tensor: Any, stream: Any) -> None:
    """Keep ``stream`` alive until the storage of ``tensor`` (shared by its views) is freed."""
    storage = tensor.untyped_storage() if hasattr(tensor, "untyped_storage") else tensor
    with _PINNED_LOCK:
        try:
            _PINNED.setdefault(storage, {})[id(stream)] = stream
        except TypeError:  # neither the storage nor the tensor takes a weak reference: keep it on the tensor
            tensor.__dict__.setdefault("_denseccl_streams", {})[id(stream)] = stream
