"""FSDP2 (fully_shard) over the denseccl backend on the CPU matches single-process training:
it runs on all_gather_into_tensor and reduce_scatter_tensor with async_op (and, for its
device mesh, named process groups). FSDP2 itself refuses non-contiguous parameters, so the
model is row-major. Run with mpiexec -n N."""

from __future__ import annotations

import torch
import torch.distributed as dist
from tests.support.checker import Checker
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import denseccl.torch as dt

dt.init_process_group()
rank, size = dist.get_rank(), dist.get_world_size()
check = Checker("torch-fsdp", rank, size)
torch.set_num_threads(1)
mesh = init_device_mesh("cpu", (size,))
check.check(bool(mesh.get_group().group_name), "the mesh's group is named")


def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4), nn.Linear(4, 3, dtype=torch.float64))


class Cast(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        x = self.inner[2](self.inner[1](self.inner[0](x)))
        return self.inner[3](x.double())


sharded, reference = Cast(model()), Cast(model())
for layer in sharded.inner:
    if isinstance(layer, nn.Linear):
        fully_shard(layer, mesh=mesh)
fully_shard(sharded, mesh=mesh)
x = torch.randn(2 * size, 8, generator=torch.Generator().manual_seed(5))
opt = torch.optim.SGD(sharded.parameters(), lr=0.1)
ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
for step in range(3):
    sharded(x[2 * rank : 2 * rank + 2]).square().mean().backward()
    reference(x).square().mean().backward()
    opt.step()
    ref_opt.step()
    opt.zero_grad()
    ref_opt.zero_grad()
state = {k: v.full_tensor() for k, v in sharded.state_dict().items()}
for name, want in reference.state_dict().items():
    check.equal(f"FSDP2 {name} after 3 steps", state[name], want, tol=1e-5)
dist.destroy_process_group()
check.done()
