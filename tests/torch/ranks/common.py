"""Helpers shared by the torch rank programs: tensors of named layouts, per-rank inputs that
every rank can rebuild (so references are computed from all ranks' inputs), and a checker."""

from __future__ import annotations

import os
import sys
from typing import Callable, Dict, List, Sequence, Tuple

import torch

#: name -> (logical shape, function allocating an empty tensor of that shape and layout)
LAYOUTS: Dict[str, Tuple[Tuple[int, ...], Callable[[Tuple[int, ...], torch.dtype], torch.Tensor]]] = {
    "row-major": ((3, 5), lambda s, d: torch.empty(s, dtype=d)),
    "transposed": ((3, 5), lambda s, d: torch.empty(s[::-1], dtype=d).t()),
    "channels-last": ((2, 3, 4, 5), lambda s, d: torch.empty(s, dtype=d).to(memory_format=torch.channels_last)),
    "permuted": ((2, 3, 4, 5), lambda s, d: torch.empty((4, 2, 5, 3), dtype=d).permute(1, 3, 0, 2)),
    "size-1 strides": ((3, 1, 4), lambda s, d: torch.empty(12, dtype=d).as_strided(s, (4, 99, 1))),
    "empty": ((0, 3), lambda s, d: torch.empty(s, dtype=d)),
    "0-d": ((), lambda s, d: torch.empty(s, dtype=d)),
}


def init() -> None:
    """``init_process_group("denseccl")`` for the launcher that started this rank: under mpiexec
    rank and world size come from MPI (denseccl.torch.init_process_group); under torchrun from
    its env:// variables (CPU tensors then move over the gloo engine)."""
    import denseccl.torch as dt
    from denseccl.config import launched_by_mpi

    if launched_by_mpi():
        dt.init_process_group()
    else:
        dt.init_process_group("denseccl")


def values(seed: int, rank: int, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """Row-major values of rank ``rank`` for case ``seed`` (any rank can compute them)."""
    generator = torch.Generator().manual_seed(seed * 1009 + rank)
    if dtype.is_floating_point:
        return (torch.rand(tuple(shape), generator=generator, dtype=torch.float64) + 0.5).to(dtype)
    return torch.randint(-20, 20, tuple(shape), generator=generator).to(dtype)


def make(layout: str, dtype: torch.dtype, seed: int, rank: int) -> torch.Tensor:
    shape, allocate = LAYOUTS[layout]
    t = allocate(shape, dtype)
    t.copy_(values(seed, rank, shape, dtype))
    return t


def like(t: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """A tensor with ``t``'s layout holding ``src``'s values."""
    out = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype)
    out.copy_(src)
    return out


class Checker:
    """Collects failures; ``done()`` prints them and exits non-zero if any."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.failures: List[str] = []
        self.count = 0

    def equal(self, what: str, got: torch.Tensor, want: torch.Tensor, *, strides: Sequence[int] = None, tol: float = 1e-6) -> None:
        self.count += 1
        if tuple(got.shape) != tuple(want.shape):
            self.failures.append(f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}")
            return
        if not torch.allclose(got.double(), want.double(), rtol=tol, atol=tol):
            self.failures.append(f"{what}: values differ\n got {got}\n want {want}")
        if strides is not None and got.numel() > 0 and _key(got.shape, got.stride()) != _key(got.shape, tuple(strides)):
            self.failures.append(f"{what}: strides {got.stride()} != {tuple(strides)}")

    def true(self, what: str, condition: bool) -> None:
        self.count += 1
        if not condition:
            self.failures.append(what)

    def raises(self, what: str, kinds, call: Callable[[], object], contains: str = "") -> BaseException:
        self.count += 1
        try:
            call()
        except kinds as error:
            if contains and contains not in str(error).lower():
                self.failures.append(f"{what}: {type(error).__name__} without {contains!r}: {error}")
            return error
        except Exception as error:  # noqa: BLE001
            self.failures.append(f"{what}: raised {type(error).__name__}: {error}")
            return error
        self.failures.append(f"{what}: did not raise")
        return None

    def done(self) -> None:
        if self.failures:
            print(f"rank {self.rank}: {len(self.failures)} of {self.count} checks failed", file=sys.stderr)
            for failure in self.failures[:40]:
                print(f"rank {self.rank} FAIL {failure}", file=sys.stderr)
            sys.stderr.flush()
            os._exit(1)
        print(f"rank {self.rank}: {self.count} checks passed", flush=True)


def _key(shape, strides):
    return tuple(None if n == 1 else s for n, s in zip(shape, strides))
