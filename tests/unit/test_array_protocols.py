"""Objects known through ``__array_interface__``, ``__cuda_array_interface__`` or ``__dlpack__``:
one that raises, is malformed or gives a NULL data pointer is a LayoutError naming the object
(never the object's own exception, never memory NumPy allocated in its place). Across ranks:
tests/mpi/test_local_errors.py."""

from __future__ import annotations

import numpy as np
import pytest

import denseccl
from denseccl import arrays
from denseccl.arrays import as_buffer
from tests.support.protocols import (
    ArrayInterface,
    CudaInterface,
    DLPack,
    NullDLPack,
    RaisingArrayInterface,
    RaisingCudaInterface,
    RaisingDLPack,
    null_interface,
)


def rejected(x: object, *words: str) -> str:
    with pytest.raises(denseccl.LayoutError) as info:
        as_buffer(x)
    text = str(info.value)
    assert type(x).__qualname__ in text and "tests.support.protocols" in text, text
    for word in words:
        assert word in text, text
    return text


def test_array_interface_that_raises() -> None:
    text = rejected(RaisingArrayInterface(), "__array_interface__", "raised Broken", "is broken")
    assert "NumPy or CuPy array or a torch tensor" in text


def test_array_interface_with_a_null_pointer() -> None:
    rejected(ArrayInterface(interface=null_interface(4)), "__array_interface__", "NULL data pointer for 4 elements")


def test_array_interface_that_is_malformed() -> None:
    rejected(
        ArrayInterface(interface={"typestr": "<f8", "data": (1, False)}), "__array_interface__", "malformed", "KeyError"
    )
    rejected(ArrayInterface(interface={"shape": (2,), "typestr": "<f8", "data": ("x", False)}), "malformed")
    rejected(
        ArrayInterface(interface={"shape": (2,), "typestr": "nonsense", "data": None, "version": 3}), "refused by NumPy"
    )


def test_empty_array_interface_with_a_null_pointer_is_an_empty_array() -> None:
    buffer = as_buffer(ArrayInterface(interface=null_interface(0)))
    assert buffer.layout.numel == 0 and buffer.layout.shape == (0,)


def test_a_good_array_interface_still_works() -> None:
    base = np.arange(6.0).reshape(2, 3)
    x = ArrayInterface(base)
    assert as_buffer(x).pointer == base.ctypes.data and as_buffer(x).owner is x


def test_cuda_array_interface_that_raises() -> None:
    rejected(RaisingCudaInterface(), "__cuda_array_interface__", "raised Broken")


def test_cuda_array_interface_with_a_null_pointer() -> None:
    # refused before CUDA is asked where the pointer lives: no GPU needed
    rejected(CudaInterface(null_interface(8, "<f4")), "__cuda_array_interface__", "NULL data pointer for 8 elements")


def test_cuda_array_interface_that_is_malformed() -> None:
    rejected(CudaInterface({"shape": (2,), "typestr": "<f4"}), "__cuda_array_interface__", "malformed")
    rejected(CudaInterface(["not", "a", "dict"]), "__cuda_array_interface__", "malformed")  # type: ignore[arg-type]
    rejected(CudaInterface({"shape": (2,), "typestr": "??", "data": (4096, False)}), "names no NumPy dtype")


def test_cuda_pointer_cuda_cannot_place(monkeypatch: pytest.MonkeyPatch) -> None:
    def unknown(pointer: int) -> int:
        raise RuntimeError("cudaErrorInvalidValue")

    monkeypatch.setattr(denseccl.arrays, "_cuda_device_of_pointer", unknown)
    rejected(
        CudaInterface({"shape": (2,), "typestr": "<f4", "data": (4096, False), "version": 3}),
        "0x1000",
        "cudaErrorInvalidValue",
    )


def test_dlpack_that_raises() -> None:
    rejected(RaisingDLPack(), "__dlpack__", "raised Broken")


def test_dlpack_with_a_null_pointer() -> None:
    rejected(NullDLPack(5), "__dlpack__", "NULL data pointer for 5 elements")


def test_a_good_dlpack_still_works() -> None:
    base = np.arange(4, dtype=np.int32)
    x = DLPack(base)
    buffer = as_buffer(x)
    assert buffer.pointer == base.ctypes.data and buffer.owner is x and buffer.layout.numel == 4
    empty = as_buffer(NullDLPack(0))
    assert empty.layout.numel == 0


def test_dlpack_of_writable_memory_is_writable_on_every_numpy() -> None:
    """Older NumPy (2.1 among them) imports every DLPack array read-only, and newer NumPy one of a
    DLPack 0.x exporter; the exporter's own flag decides (0.x: writable), so an in-place call
    accepts them."""
    base = np.arange(4, dtype=np.int32)
    assert not as_buffer(DLPack(base)).readonly
    assert not as_buffer(DLPack0(base)).readonly


class DLPack0:
    """An exporter of DLPack 0.x only: its ``__dlpack__`` takes no ``max_version``."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def __dlpack__(self, stream: object = None) -> object:
        return self.array.__dlpack__()

    def __dlpack_device__(self) -> object:
        return self.array.__dlpack_device__()


def test_the_read_only_flag_of_an_export() -> None:
    """What ``as_buffer`` asks an exporter where NumPy's view cannot tell: DLPack 1.0's flag, or
    writable for an exporter of DLPack 0.x, which has none."""
    writable = np.arange(4.0)
    assert not arrays._exported_read_only(DLPack(writable))
    assert not arrays._exported_read_only(DLPack0(writable))
    if np.lib.NumpyVersion(np.__version__) >= "2.1.0":  # older NumPy exports no read-only array
        frozen = np.arange(4.0)
        frozen.flags.writeable = False
        assert arrays._exported_read_only(DLPack(frozen))


def test_dlpack_of_read_only_memory() -> None:
    """A read-only array exported through DLPack: NumPy 2.1 and newer pass the flag on, so the
    buffer is read-only; older NumPy refuses to export it, which is a LayoutError."""
    base = np.arange(4, dtype=np.int32)
    base.flags.writeable = False
    if np.lib.NumpyVersion(np.__version__) >= "2.1.0":
        assert as_buffer(DLPack(base)).readonly
    else:
        rejected(DLPack(base), "DLPack")
