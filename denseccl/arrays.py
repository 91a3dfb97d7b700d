"""Adapters from user arrays to a :class:`Buffer`, and allocation of arrays of a given layout.

Supported: NumPy arrays, torch tensors (CPU and CUDA; torch is imported only when a tensor
arrives), CuPy arrays, and any object with ``__cuda_array_interface__``,
``__array_interface__`` or ``__dlpack__`` (host memory). Strides are converted to elements here;
byte strides that are not a multiple of the itemsize are refused.
"""

from __future__ import annotations

import sys
from functools import lru_cache
from math import prod
from typing import Any, Dict, NamedTuple, Tuple

import numpy as np

from .dtypes import DTYPES
from .errors import LayoutError
from .layout import Layout, contiguous_strides

#: Device of a buffer: -1 for host memory, else the CUDA device index.
HOST = -1


class Buffer(NamedTuple):
    """What a collective needs of an array: where it lives, its layout, and the array itself
    (kept alive while a transfer runs, and used to allocate results of the same kind)."""

    pointer: int
    layout: Layout
    device: int
    library: str  # "numpy", "torch", "cupy" or "cuda_array_interface"
    readonly: bool
    owner: Any

    @property
    def span_pointer(self) -> int:
        """Address of the first byte of the storage span."""
        return self.pointer + self.layout.span[0] * self.layout.itemsize

    def describe(self) -> str:
        where = "host" if self.device == HOST else f"cuda:{self.device}"
        return f"{self.library} array on {where}, {self.layout.describe()}"


@lru_cache(maxsize=None)  # a handful of dtypes; refusals raise and are not cached
def _numpy_dtype_name(dtype: np.dtype) -> str:
    if dtype.hasobject or dtype.fields is not None or dtype.subdtype is not None:
        raise LayoutError(f"dtype {dtype} is not a numeric element type; only plain numeric dtypes can be reduced")
    if not dtype.isnative:
        raise LayoutError(
            f"dtype {dtype.str} is not in the machine's byte order; convert it first, e.g. "
            "x.astype(x.dtype.newbyteorder('='))"
        )
    if dtype.name not in DTYPES:
        raise LayoutError(f"dtype {dtype} is not supported (supported: {', '.join(DTYPES)})")
    return dtype.name


@lru_cache(maxsize=8192)
def _layout_from_bytes(shape: Tuple[int, ...], byte_strides: Tuple[int, ...], itemsize: int, dtype: str) -> Layout:
    """Layout with element strides, cached: arrays of the same geometry share one Layout."""
    if any(stride % itemsize for stride in byte_strides):
        raise LayoutError(
            f"{dtype} array of shape {shape} has byte strides {byte_strides} that are not multiples of "
            f"its itemsize {itemsize}; copy it into an aligned array first (e.g. np.ascontiguousarray(x))"
        )
    return Layout(shape, tuple(stride // itemsize for stride in byte_strides), itemsize, dtype)


def _numpy_pointer_reader() -> Any:
    """A fast ``x -> x.ctypes.data`` (which costs ~2 us, the largest part of a small call).

    CPython's ``id(x)`` is the object's address and NumPy's ``PyArrayObject_fields`` puts the
    ``data`` pointer right after the object header. Used only when that reading agrees with
    ``ctypes.data`` on probe arrays (views, offsets, empty and 0-d); else ``ctypes.data``.
    """
    fallback = lambda x: x.ctypes.data  # noqa: E731
    if sys.implementation.name != "cpython":
        return fallback
    import ctypes  # noqa: PLC0415

    read = ctypes.c_void_p.from_address
    offset = object.__basicsize__

    def pointer(x: np.ndarray) -> int:
        return read(id(x) + offset).value or 0

    base = np.arange(24, dtype=np.float64).reshape(2, 3, 4)
    probes = (base, base[1], base[:, ::-1, 1:], base.T, np.empty(0), np.zeros((), np.float32), base.view(np.uint8)[3:])
    try:
        if all(pointer(p) == p.ctypes.data for p in probes):
            return pointer
    except Exception:  # noqa: BLE001 - any surprise: use the documented way
        pass
    return fallback


#: ``data_pointer(x)`` = ``x.ctypes.data`` for a NumPy array, ~10x faster.
data_pointer = _numpy_pointer_reader()


def _numpy_buffer(x: np.ndarray) -> Buffer:
    dtype = x.dtype
    layout = _layout_from_bytes(x.shape, x.strides, dtype.itemsize, _numpy_dtype_name(dtype))
    return Buffer(data_pointer(x), layout, HOST, "numpy", not x.flags.writeable, x)


@lru_cache(maxsize=None)
def _torch_dtype_name(dtype: Any) -> str:
    name = str(dtype).rpartition(".")[2]
    if name not in DTYPES:
        raise LayoutError(f"torch dtype {dtype} is not supported (supported: {', '.join(DTYPES)})")
    return name


def _torch_buffer(x: Any) -> Buffer:
    if x.layout is not sys.modules["torch"].strided:
        raise LayoutError(f"torch tensor with layout {x.layout} is not supported; pass a strided (dense) tensor")
    name = _torch_dtype_name(x.dtype)
    itemsize = x.element_size()
    shape = tuple(x.shape)
    layout = _layout_from_bytes(shape, tuple(s * itemsize for s in x.stride()), itemsize, name)
    device = x.device
    if device.type == "cpu":
        index = HOST
    elif device.type == "cuda":
        index = device.index if device.index is not None else 0
    else:
        raise LayoutError(f"torch tensor on device {device} is not supported; use a cpu or cuda tensor")
    return Buffer(x.data_ptr(), layout, index, "torch", False, x)


def _describe(x: Any) -> str:
    """How an error names the object the caller passed: its type, with the module it comes from."""
    kind = type(x)
    module = "" if kind.__module__ == "builtins" else f"{kind.__module__}."
    return f"the {module}{kind.__qualname__} object"


def _protocol_error(x: Any, protocol: str, problem: str) -> LayoutError:
    return LayoutError(
        f"{_describe(x)} cannot be used as an array: its {protocol} {problem}. Pass a NumPy or CuPy array or a "
        f"torch tensor, or fix the object's {protocol}"
    )


def _protocol(x: Any, name: str) -> Any:
    """``x.<name>`` (None where ``x`` has none); :class:`LayoutError` where reading it raises."""
    try:
        return getattr(x, name, None)
    except Exception as error:
        raise _protocol_error(x, name, f"raised {type(error).__name__}: {error}") from error


def _interface_fields(x: Any, interface: Any, name: str) -> Tuple[Tuple[int, ...], Any, Any, int, bool]:
    """``(shape, typestr, strides, data pointer, readonly)`` of an array interface dict, with
    the pointer checked: NULL only where the array is empty."""
    try:
        shape = tuple(int(size) for size in interface["shape"])
        typestr, strides = interface["typestr"], interface.get("strides")
        if strides is not None:
            strides = tuple(int(stride) for stride in strides)
        pointer, readonly = interface["data"]
        pointer = int(pointer or 0)
    except Exception as error:
        raise _protocol_error(x, name, f"is malformed ({type(error).__name__}: {error})") from error
    count = prod(shape)
    if count and not pointer:
        raise _protocol_error(x, name, f"gives a NULL data pointer for {count} elements")
    return shape, typestr, strides, pointer, bool(readonly)


def _interface_layout(x: Any, name: str, shape: Tuple[int, ...], typestr: Any, strides: Any) -> Layout:
    """The Layout an array interface describes (strides None: row-major)."""
    try:
        dtype = np.dtype(typestr)
    except (TypeError, ValueError) as error:
        raise _protocol_error(x, name, f"names no NumPy dtype ({error})") from error
    if strides is None:
        strides = tuple(s * dtype.itemsize for s in contiguous_strides(shape))
    return _layout_from_bytes(shape, strides, dtype.itemsize, _numpy_dtype_name(dtype))


def _interface_buffer(x: Any, interface: Dict[str, Any], library: str) -> Buffer:
    """A ``__cuda_array_interface__`` object's Buffer."""
    name = "__cuda_array_interface__"
    if isinstance(interface, dict) and interface.get("mask") is not None:
        raise LayoutError("masked arrays are not supported; fill the mask first")
    shape, typestr, strides, pointer, readonly = _interface_fields(x, interface, name)
    layout = _interface_layout(x, name, shape, typestr, strides)
    try:
        device = _cuda_device_of_pointer(pointer)
    except ImportError:
        raise
    except Exception as error:
        raise _protocol_error(
            x, name, f"gives a pointer ({pointer:#x}) CUDA cannot place on a device ({type(error).__name__}: {error})"
        ) from error
    return Buffer(pointer, layout, device, library, readonly, x)


def _array_interface_buffer(x: Any, interface: Any) -> Buffer:
    """Host memory known through ``__array_interface__``: validated as NumPy's view of it; the
    object itself is the owner, so an in-place call returns it."""
    name = "__array_interface__"
    if isinstance(interface, dict) and interface.get("data") is not None:  # None: the buffer protocol's memory
        shape, typestr, strides, pointer, readonly = _interface_fields(x, interface, name)
        if not pointer:  # an empty array (checked above), which older NumPy (2.0) refuses to view
            return Buffer(0, _interface_layout(x, name, shape, typestr, strides), HOST, "numpy", readonly, x)
    try:
        view = np.asarray(x)
    except Exception as error:
        raise _protocol_error(x, name, f"is refused by NumPy ({type(error).__name__}: {error})") from error
    if view.dtype.hasobject:  # NumPy fell back to wrapping the object itself
        raise _protocol_error(x, name, "describes no numeric array")
    return _numpy_buffer(view)._replace(owner=x)


def _exported_read_only(x: Any) -> bool:
    """DLPack 1.0's read-only flag of ``x``'s export, read from its versioned capsule, which is
    then dropped unconsumed (its destructor releases the export). An exporter of DLPack 0.x only
    has no such flag: its memory counts as writable, as torch and CuPy take it (NumPy before 2.1,
    which refused to export a read-only array, is such an exporter)."""
    import ctypes  # noqa: PLC0415 - only for a read-only view, which is rare

    try:
        capsule = x.__dlpack__(max_version=(1, 0))
    except TypeError:  # no max_version: DLPack 0.x
        return False
    name = b"dltensor_versioned"
    api = ctypes.pythonapi
    api.PyCapsule_IsValid.argtypes, api.PyCapsule_IsValid.restype = [ctypes.py_object, ctypes.c_char_p], ctypes.c_int
    if not api.PyCapsule_IsValid(capsule, name):  # a DLPack 0.x capsule after all
        return False
    api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    api.PyCapsule_GetPointer.restype = ctypes.c_void_p
    managed = api.PyCapsule_GetPointer(capsule, name)
    # DLManagedTensorVersioned: {uint32 major, minor; void *manager_ctx; void (*deleter)(...);
    # uint64_t flags; DLTensor dl_tensor}; bit 0 of flags is DLPACK_FLAG_BITMASK_READ_ONLY
    return bool(ctypes.c_uint64.from_address(managed + 24).value & 1)


def _dlpack_buffer(x: Any) -> Buffer:
    """Host memory known through DLPack, as NumPy's view of it (the object is the owner)."""
    try:
        view = np.from_dlpack(x)
    except (BufferError, RuntimeError, TypeError) as error:
        raise LayoutError(f"{_describe(x)} exposes DLPack but not as host memory NumPy can view: {error}") from None
    except Exception as error:
        raise _protocol_error(x, "__dlpack__", f"raised {type(error).__name__}: {error}") from error
    if view.size and view.flags.owndata:  # NumPy allocated new memory: the tensor's data pointer was NULL
        raise _protocol_error(x, "__dlpack__", f"gives a NULL data pointer for {view.size} elements")
    buffer = _numpy_buffer(view)._replace(owner=x)
    # NumPy marks its view read-only wherever it cannot tell: older NumPy always (2.1, which
    # reads DLPack 1.0, still does; 2.4 does not), and for an exporter of DLPack 0.x. The
    # exporter's own flag decides.
    return buffer._replace(readonly=_exported_read_only(x)) if buffer.readonly else buffer


def _cupy_buffer(x: Any) -> Buffer:
    dtype = x.dtype
    layout = _layout_from_bytes(x.shape, x.strides, dtype.itemsize, _numpy_dtype_name(dtype))
    return Buffer(x.data.ptr, layout, x.device.id, "cupy", False, x)


def as_buffer(x: Any) -> Buffer:
    """The :class:`Buffer` of an array; :class:`LayoutError` if ``x`` is not an array we know."""
    if type(x) is np.ndarray:
        return _numpy_buffer(x)
    module = type(x).__module__
    if module.startswith("torch") and "torch" in sys.modules and isinstance(x, sys.modules["torch"].Tensor):
        return _torch_buffer(x)
    if module.startswith("cupy"):
        return _cupy_buffer(x)
    if isinstance(x, np.ndarray):
        if isinstance(x, np.ma.MaskedArray):
            raise LayoutError(
                "masked arrays are not supported: the mask would be ignored; pass x.filled(value) or x.data"
            )
        return _numpy_buffer(x)
    interface = _protocol(x, "__cuda_array_interface__")
    if interface is not None:
        return _interface_buffer(x, interface, "cuda_array_interface")
    interface = _protocol(x, "__array_interface__")
    if interface is not None:
        return _array_interface_buffer(x, interface)
    if _protocol(x, "__dlpack__") is not None:
        return _dlpack_buffer(x)
    raise LayoutError(
        f"expected an array (NumPy, CuPy, torch, or an object with __cuda_array_interface__, "
        f"__array_interface__ or __dlpack__), got {type(x).__name__}"
    )


def _cuda_device_of_pointer(pointer: int) -> int:
    import cupy  # noqa: PLC0415 - only device arrays need it

    if not pointer:
        return cupy.cuda.runtime.getDevice()
    attributes = cupy.cuda.runtime.pointerGetAttributes(pointer)
    return int(attributes.device)


def allocate(like: Buffer, layout: Layout) -> Any:
    """A new, uninitialised array with ``layout`` of the same kind and device as ``like``."""
    lo, numel = layout.span
    if not numel:
        lo = 0  # an empty array addresses nothing: a negative lo would point before its buffer
    if like.library == "torch":
        torch = sys.modules["torch"]
        device = "cpu" if like.device == HOST else f"cuda:{like.device}"
        return torch.empty_strided(layout.shape, layout.strides, dtype=like.owner.dtype, device=device)
    byte_strides = tuple(s * layout.itemsize for s in layout.strides)
    if like.device == HOST:
        dtype = like.owner.dtype if isinstance(like.owner, np.ndarray) else np.dtype(layout.dtype)
        base = np.empty(numel, dtype)
        return np.ndarray(layout.shape, dtype, buffer=base, offset=-lo * layout.itemsize, strides=byte_strides)
    import cupy  # noqa: PLC0415

    dtype = like.owner.dtype if like.library == "cupy" else np.dtype(layout.dtype)
    with cupy.cuda.Device(like.device):
        memory = cupy.cuda.alloc(max(numel, 1) * layout.itemsize)
        return cupy.ndarray(layout.shape, dtype, memptr=memory + (-lo * layout.itemsize), strides=byte_strides)
