"""The array libraries a benchmark case can be built in: NumPy, torch (CPU or CUDA) and CuPy.

Each adapter offers the few operations the cases and contenders need: allocate a physical
block, permute and mirror it into a layout, copy logical values in and out, and wait for the
device.
"""

from __future__ import annotations

from math import prod
from typing import Any, Sequence

import numpy as np


class Unsupported(Exception):
    """This library cannot build this case (the message says why); the row is skipped."""


class NumpyLib:
    """NumPy arrays in host memory."""

    device = False
    xp: Any = np

    def dtype(self, name: str) -> Any:
        if name == "bfloat16":
            try:
                import ml_dtypes  # noqa: PLC0415 - optional

                return np.dtype(ml_dtypes.bfloat16)
            except ImportError:
                raise Unsupported("NumPy has no bfloat16 (install ml_dtypes)") from None
        return np.dtype(name)

    def empty(self, shape: Sequence[int], dtype: str, *, arena: Any = None, role: str = "input") -> Any:
        dt = self.dtype(dtype)
        if arena is None:
            return self.xp.empty(tuple(shape), dt)
        memory = arena.device if self.device else arena.host
        return memory(prod(shape) * dt.itemsize, role).view(dt).reshape(tuple(shape))

    def permute(self, array: Any, axes: Sequence[int]) -> Any:
        return array.transpose(tuple(axes))

    def mirror(self, array: Any, dims: Sequence[int]) -> Any:
        index = tuple(slice(None, None, -1) if d in dims else slice(None) for d in range(array.ndim))
        return array[index]

    def assign(self, target: Any, values: np.ndarray) -> None:
        target[...] = self.xp.asarray(values.reshape(target.shape).astype(target.dtype, copy=False))

    def fill_zero(self, target: Any) -> None:
        target[...] = 0

    def to_numpy(self, array: Any) -> np.ndarray:
        array = np.asarray(array)
        return array.astype(np.float32) if array.dtype.name == "bfloat16" else array

    def synchronize(self) -> None:
        pass


class TorchLib:
    """torch tensors on ``device`` ("cpu", "cuda:0", ...)."""

    def __init__(self, device: str = "cpu") -> None:
        import torch  # noqa: PLC0415 - optional

        self.torch = torch
        self.device_name = device
        self.device = device != "cpu"

    def dtype(self, name: str) -> Any:
        return getattr(self.torch, name)

    def empty(self, shape: Sequence[int], dtype: str, *, arena: Any = None, role: str = "input") -> Any:
        dt = self.dtype(dtype)
        if arena is None:
            return self.torch.empty(tuple(shape), dtype=dt, device=self.device_name)
        nbytes = prod(shape) * dt.itemsize
        if self.device:
            raw = self.torch.as_tensor(arena.device(nbytes, role), device=self.device_name)
        else:
            raw = self.torch.from_numpy(arena.host(nbytes, role))
        return raw.view(dt).reshape(tuple(shape))

    def permute(self, array: Any, axes: Sequence[int]) -> Any:
        return array.permute(*axes)

    def mirror(self, array: Any, dims: Sequence[int]) -> Any:
        if dims:
            raise Unsupported("torch tensors cannot have negative strides")
        return array

    def assign(self, target: Any, values: np.ndarray) -> None:
        target.copy_(self.torch.from_numpy(np.ascontiguousarray(values).reshape(tuple(target.shape))))

    def fill_zero(self, target: Any) -> None:
        target.zero_()

    def to_numpy(self, array: Any) -> np.ndarray:
        array = array.detach().cpu()
        if array.dtype == self.torch.bfloat16:
            array = array.float()
        return array.numpy()

    def synchronize(self) -> None:
        if self.device:
            self.torch.cuda.synchronize()


class CupyLib(NumpyLib):
    """CuPy arrays: NumPy's array protocol (permute, mirror) on device memory."""

    device = True

    def __init__(self) -> None:
        import cupy  # noqa: PLC0415 - optional

        self.xp = cupy

    def dtype(self, name: str) -> Any:
        if name == "bfloat16":
            raise Unsupported("CuPy has no bfloat16")
        return np.dtype(name)

    def to_numpy(self, array: Any) -> np.ndarray:
        return self.xp.asnumpy(array)

    def synchronize(self) -> None:
        self.xp.cuda.get_current_stream().synchronize()
