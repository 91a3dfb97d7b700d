"""DDP over the denseccl backend keeps the Gradient Layout Contract and matches a
single-process reference (torch's grad-layout test, on the CPU with real ranks).

A 4-layer Conv2d net (8 -> 16 -> 32 -> 16 -> 8 channels, kernel 2) whose layers are each
contiguous or channels-last and float32 or float64; tiny and 25 MB buckets; gradient_as_bucket_view
off and on. Each rank trains on its slice of a global batch for 3 iterations (grads set to None
after the first, zeroed after the second) beside a reference model trained on the whole batch.
Run with mpiexec -n N."""

from __future__ import annotations

import contextlib
import copy
import itertools
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from common import Checker
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import denseccl.torch as dt

dt.init_process_group()
rank, size = dist.get_rank(), dist.get_world_size()
check = Checker(rank)
torch.set_num_threads(1)

CL, RM = torch.channels_last, torch.contiguous_format
FORMATS = {"contiguous": [RM] * 4, "mixed": [CL, CL, RM, RM], "channels-last": [CL] * 4}
DTYPES = {
    "float32": [torch.float32] * 4,
    "mixed": [torch.float32, torch.float32, torch.float64, torch.float64],
    "float64": [torch.float64] * 4,
}


class ConvNet(nn.Module):
    def __init__(self, formats, dtypes):
        super().__init__()
        self.dtypes = dtypes
        channels = (8, 16, 32, 16, 8)
        self.layers = nn.ModuleList(
            nn.Conv2d(channels[i], channels[i + 1], 2).to(memory_format=formats[i], dtype=dtypes[i]) for i in range(4)
        )

    def forward(self, x):
        for layer, dtype in zip(self.layers, self.dtypes):
            x = layer(x.to(dtype))
        return x


@contextlib.contextmanager
def first_bucket_mb(mb):
    """DDP's first bucket ignores bucket_cap_mb; make it obey too."""
    old = dist._DEFAULT_FIRST_BUCKET_BYTES
    dist._DEFAULT_FIRST_BUCKET_BYTES = int(mb * 1e6)
    try:
        yield
    finally:
        dist._DEFAULT_FIRST_BUCKET_BYTES = old


def key(t):
    return tuple(None if n == 1 else s for n, s in zip(t.shape, t.stride()))


local = 2
generator = torch.Generator().manual_seed(1234)
inputs = torch.randn(local * size, 8, 8, 8, generator=generator)
target = torch.randn(local * size, 8, 4, 4, generator=generator)
mine = slice(rank * local, (rank + 1) * local)
started = time.monotonic()
configs = 0
for (fname, formats), (dname, dtypes), bucket_mb, as_view in itertools.product(
    FORMATS.items(), DTYPES.items(), (1e-6, 25), (False, True)
):
    name = f"formats={fname} dtypes={dname} bucket_cap_mb={bucket_mb} gradient_as_bucket_view={as_view}"
    torch.manual_seed(7)
    model = ConvNet(formats, dtypes)
    with first_bucket_mb(bucket_mb):
        ddp = DDP(copy.deepcopy(model), bucket_cap_mb=bucket_mb, gradient_as_bucket_view=as_view)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt_ddp = torch.optim.SGD(ddp.parameters(), lr=0.1)
    tol = 1e-5 if torch.float32 in dtypes else 1e-10
    for it in range(3):
        F.mse_loss(model(inputs).float(), target).backward()
        F.mse_loss(ddp(inputs[mine]).float(), target[mine]).backward()
        for (pname, p), p_ddp in zip(model.named_parameters(), ddp.module.parameters()):
            where = f"{name} iteration {it} {pname}"
            check.equal(f"grad {where}", p_ddp.grad, p.grad, tol=tol)
            check.true(
                f"grad strides {p_ddp.grad.stride()} != param strides {p_ddp.stride()}: {where}",
                key(p_ddp.grad) == key(p_ddp),
            )
            check.true(f"reference grad strides: {where}", key(p.grad) == key(p))
        check.true(f"no contract violations: {name} iteration {it}", not dt.grad_layout_violations(ddp.module))
        opt.step()
        opt_ddp.step()
        if it == 0:
            for p, p_ddp in zip(model.parameters(), ddp.parameters()):
                p.grad = None
                p_ddp.grad = None
        else:
            model.zero_grad()
            ddp.zero_grad()
    for (pname, p), p_ddp in zip(model.named_parameters(), ddp.module.parameters()):
        check.equal(f"param after 3 steps {name} {pname}", p_ddp, p, tol=tol)
        check.true(f"param strides kept {name} {pname}", key(p_ddp) == key(p))
    configs += 1
    del ddp

check.true(f"36 configurations ran ({configs})", configs == 36)
print(f"rank {rank}: {configs} DDP configurations in {time.monotonic() - started:.1f} s", flush=True)
dist.destroy_process_group()
check.done()
