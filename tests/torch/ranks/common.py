"""Helpers shared by the torch rank programs: tensors of named layouts and per-rank inputs that
every rank can rebuild (so references are computed from all ranks' inputs). They report
through ``tests.support.checker.Checker``."""

from __future__ import annotations

import os
from typing import Callable, Dict, Optional, Sequence, Tuple

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


def _spawned(rank: int, size: int, main: Callable[[int, int], None]) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(size), LOCAL_RANK=str(rank))
    main(rank, size)


def start(main: Callable[[int, int], None], spawn: Optional[int]) -> None:
    """Run ``main(rank, size)`` on this rank as torchrun started it (``spawn`` None), or start
    ``spawn`` ranks here with ``mp.spawn`` on a free local port."""
    if spawn is None:
        main(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))
        return
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    mp.spawn(_spawned, args=(spawn, main), nprocs=spawn)


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
