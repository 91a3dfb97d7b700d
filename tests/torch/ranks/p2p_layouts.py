"""send/recv between every pair of layouts (tests/torch/ranks/common.py's, plus a gapped view
that is not dense), both directions, against the values the sender holds: the receiver gets
the sender's values in its own layout. Each pair twice: as small messages go (header and span
in one message, copied on each side) and as large ones do (two messages): there, where the
receiver's layout is the sender's (or both hold their values row-major), no copy lands them
(``p2p.land`` is counted), and the sender never copies a dense tensor (what the engine sends
starts at the tensor's own data pointer).

usage: p2p_layouts.py     (2 ranks; torchrun: the gloo engine, mpiexec: MPI)
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Dict, List

import torch
import torch.distributed as dist

import denseccl.torch
from denseccl import config
from denseccl.torch import p2p
from tests.support.checker import Checker
from tests.torch.ranks.common import LAYOUTS

LANDED: List[int] = []
SENT: List[int] = []


def counted(land: Any) -> Any:
    def landing(out: torch.Tensor, received: torch.Tensor) -> None:
        LANDED.append(1)
        land(out, received)

    return landing


def layouts() -> Dict[str, torch.Tensor]:
    made = {name: make(shape, torch.float32) for name, (shape, make) in LAYOUTS.items()}
    made["gapped"] = torch.empty((3, 10), dtype=torch.float32)[:, ::2]  # (3, 5), not dense
    return made


def values(t: torch.Tensor, seed: int) -> torch.Tensor:
    return (torch.arange(t.numel(), dtype=torch.float32) * 3 + seed).reshape(t.shape)


def row_major(t: torch.Tensor) -> bool:
    return p2p.order_of(t) is not None and p2p.row_major(tuple(t.shape), p2p.order_of(t))  # type: ignore[arg-type]


def main() -> None:
    denseccl.torch.init_process_group(timeout=timedelta(seconds=60))
    rank, size = dist.get_rank(), dist.get_world_size()
    check = Checker("p2p-layouts", rank, size)
    p2p.land = counted(p2p.land)  # type: ignore[attr-defined]
    shapes = {name: t.shape for name, t in layouts().items()}
    pairs = [(a, b) for a in shapes for b in shapes if shapes[a] == shapes[b]]
    small = config.P2P_ONE_MESSAGE_BYTES
    for seed, (sending, receiving, one_message) in enumerate((a, b, one) for a, b in pairs for one in (True, False)):
        config.P2P_ONE_MESSAGE_BYTES = small if one_message else -1  # type: ignore[misc]
        for sender in (0, 1):
            LANDED.clear()
            if rank == sender:
                t = layouts()[sending]
                t.copy_(values(t, seed))
                before = t.clone()
                dist.send(t, 1 - sender, tag=seed)
                check.check(torch.equal(t, before), f"{sending} -> {receiving}: the sent tensor changed")
            else:
                out = layouts()[receiving]
                strides = out.stride()
                out.fill_(-1)
                dist.recv(out, sender, tag=seed)
                check.equal(f"{sending} -> {receiving} from rank {sender}", out, values(out, seed), strides=strides)
                same = p2p.order_of(out) is not None and (
                    sending == receiving or (row_major(out) and row_major(layouts()[sending]))
                )
                if same and out.numel() and not one_message:
                    check.check(not LANDED, f"{sending} -> {receiving}: landed through a copy, layouts allow none")
    # a dense sender's span goes as it lies: what the engine sends starts at its data pointer
    engine = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))._aux
    send = engine.send

    def recorded(tensor: torch.Tensor, dst: int, tag: int) -> Any:
        SENT.append(tensor.data_ptr())
        return send(tensor, dst, tag)

    config.P2P_ONE_MESSAGE_BYTES = -1  # type: ignore[misc]  # as large tensors go
    engine.send = recorded
    t = layouts()["channels-last"]
    t.copy_(values(t, 7))
    if rank == 0:
        dist.send(t, 1, tag=999)
        check.check(SENT[-1] == t.data_ptr(), "a channels-last send was copied before it went")
    else:
        dist.recv(t, 0, tag=999)
    dist.barrier()
    dist.destroy_process_group()
    check.done()


if __name__ == "__main__":
    main()
