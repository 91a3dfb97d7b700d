"""Objects that expose memory through an array protocol, well or badly: for the tests of what
denseccl does with a protocol that raises, is malformed or gives a NULL data pointer."""

from __future__ import annotations

import ctypes
from typing import Any, Dict

import numpy as np


class Broken(Exception):
    """What a broken protocol raises (not a type denseccl could mistake for its own)."""


class ArrayInterface:
    """``__array_interface__`` exposing ``array``'s memory (or the dict given)."""

    def __init__(self, array: Any = None, interface: Dict[str, Any] = None) -> None:  # type: ignore[assignment]
        self.keep = array
        self.__array_interface__ = interface if interface is not None else array.__array_interface__


class RaisingArrayInterface:
    @property
    def __array_interface__(self) -> Dict[str, Any]:
        raise Broken("the array interface is broken")


class CudaInterface:
    def __init__(self, interface: Dict[str, Any]) -> None:
        self.__cuda_array_interface__ = interface


class RaisingCudaInterface:
    @property
    def __cuda_array_interface__(self) -> Dict[str, Any]:
        raise Broken("the CUDA array interface is broken")


def null_interface(count: int, typestr: str = "<f8") -> Dict[str, Any]:
    return {"shape": (count,), "typestr": typestr, "data": (0, False), "version": 3}


class DLPack:
    """``__dlpack__`` of a NumPy array, through an object that is not one."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def __dlpack__(self, **options: Any) -> Any:
        return self.array.__dlpack__(**options)

    def __dlpack_device__(self) -> Any:
        return self.array.__dlpack_device__()


class RaisingDLPack:
    def __dlpack__(self, **options: Any) -> Any:
        raise Broken("the DLPack export is broken")

    def __dlpack_device__(self) -> Any:
        return (1, 0)


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _Device),
        ("ndim", ctypes.c_int32),
        ("dtype", _DataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _Managed(ctypes.Structure):
    _fields_ = [("dl_tensor", _Tensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


_capsule = ctypes.pythonapi.PyCapsule_New
_capsule.restype = ctypes.py_object
_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
#: the structs of every NullDLPack export: NumPy reads them again when it drops its view
_EXPORTED: list = []


class NullDLPack:
    """A host float64 DLPack tensor of ``count`` elements whose data pointer is NULL (NumPy
    silently allocates new memory for it)."""

    def __init__(self, count: int) -> None:
        self.count = count

    def __dlpack__(self, **options: Any) -> Any:
        shape = (ctypes.c_int64 * 1)(self.count)
        managed = _Managed(_Tensor(None, _Device(1, 0), 1, _DataType(2, 64, 1), shape, None, 0), None, None)
        _EXPORTED.append((shape, managed))
        return _capsule(ctypes.addressof(managed), b"dltensor", None)

    def __dlpack_device__(self) -> Any:
        return (1, 0)
