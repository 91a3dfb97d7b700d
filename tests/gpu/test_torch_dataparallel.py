"""denseccl.torch on CUDA: DataParallel's layout-preserving replicas and gradient reduction on
real GPUs, and the "denseccl" process group on CUDA tensors with one rank. Skipped without a
CUDA GPU (the same layout logic runs on CPU devices in tests/torch/test_torch_units.py)."""

from __future__ import annotations

import datetime

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU (torch.cuda.is_available() is False)", allow_module_level=True)

import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402

import denseccl  # noqa: E402
import denseccl.torch as dt  # noqa: E402

pytestmark = pytest.mark.gpu
CL = torch.channels_last
GPUS = torch.cuda.device_count()


def key(t):
    return tuple(None if n == 1 else s for n, s in zip(t.shape, t.stride()))


def channels_last_net(device="cuda:0"):
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3), nn.ReLU(), nn.Conv2d(16, 8, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4)
    )
    return model.to(device).to(memory_format=CL)


def replica_params(replica):
    return [t for m in replica.modules() for t in m._former_parameters.values()]


def test_replicate_on_one_gpu_keeps_layouts_and_reduces_into_them():
    model = channels_last_net()
    devices = [0, 0] if GPUS == 1 else list(range(min(GPUS, 3)))
    replicas = dt.replicate(model, devices)
    for replica, device in zip(replicas, devices):
        for p, r in zip(model.parameters(), replica_params(replica)):
            assert key(r) == key(p) and r.device == torch.device("cuda", device)
    x = torch.randn(2 * len(devices), 3, 10, 10, device="cuda:0")
    chunks = [c.to(f"cuda:{d}") for c, d in zip(x.chunk(len(devices)), devices)]
    sum(r(c).square().sum().to("cuda:0") for r, c in zip(replicas, chunks)).backward()
    reference = channels_last_net()
    for c in x.chunk(len(devices)):
        reference(c).square().sum().backward()
    for p, q in zip(model.parameters(), reference.parameters()):
        assert key(p.grad) == key(p)
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)


def test_reduce_add_coalesced_on_gpu():
    params = [torch.empty(8, 3, 3, 3, device="cuda:0").to(memory_format=CL), torch.empty(5, 3, device="cuda:0").t()]
    per_device = [[torch.randn(p.shape, device=f"cuda:{d % GPUS}") for p in params] for d in range(2)]
    out = dt.reduce_add_coalesced(per_device, "cuda:0", params)
    for i, p in enumerate(params):
        assert key(out[i]) == key(p)
        torch.testing.assert_close(out[i], per_device[0][i] + per_device[1][i].to("cuda:0"))


def test_dataparallel_matches_the_module_and_keeps_grad_layouts():
    model, reference = channels_last_net(), channels_last_net()
    parallel = dt.DataParallel(model)
    x = torch.randn(4 * max(GPUS, 1), 3, 10, 10, device="cuda:0")
    torch.testing.assert_close(parallel(x), reference(x), rtol=1e-4, atol=1e-5)
    parallel(x).square().sum().backward()
    reference(x).square().sum().backward()
    assert dt.grad_layout_violations(model) == []
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(GPUS < 2, reason="torch replicates only to other GPUs")
def test_replicas_are_channels_last_where_torchs_are_not():
    model = channels_last_net()
    seen = {}

    def record(module, inputs, output, name):
        seen.setdefault(name, []).append(module.weight.stride())

    for name, cls in (("denseccl", dt.DataParallel), ("torch", nn.DataParallel)):
        handle = model[0].register_forward_hook(lambda m, i, o, name=name: record(m, i, o, name))
        cls(model, device_ids=[0, 1])(torch.randn(4, 3, 10, 10, device="cuda:0"))
        handle.remove()
    assert all(s == model[0].weight.stride() for s in seen["denseccl"])
    assert any(s != model[0].weight.stride() for s in seen["torch"])


def test_process_group_on_cuda_tensors_single_rank():
    """The "denseccl" backend with one rank: the NCCL transport is created on the first CUDA
    collective; layouts are kept, staging happens where dim 0 is not outermost."""
    dist.init_process_group(
        "denseccl", store=dist.HashStore(), rank=0, world_size=1, timeout=datetime.timedelta(seconds=60)
    )
    try:
        pg = dist.group.WORLD
        x = torch.arange(24.0, device="cuda").reshape(2, 3, 2, 2).to(memory_format=CL)
        want = x.clone()
        dist.all_reduce(x)
        assert torch.equal(x, want) and x.stride() == want.stride()
        t = torch.arange(12.0, device="cuda").reshape(4, 3).t()  # transposed: NCCL's torch backend refuses it
        dist.all_reduce(t, op=dist.ReduceOp.AVG, async_op=True).wait()
        assert torch.equal(t, torch.arange(12.0, device="cuda").reshape(4, 3).t())
        out = torch.empty(3, 4, device="cuda").t()  # dim 0 inner: staged
        before = pg.staged_operations
        dist.all_gather_into_tensor(out, torch.arange(12.0, device="cuda").reshape(4, 3))
        assert pg.staged_operations == before + 1
        torch.cuda.synchronize()
        assert torch.equal(out, torch.arange(12.0, device="cuda").reshape(4, 3))
        with pytest.raises(denseccl.LayoutError):
            dist.all_reduce(torch.arange(10.0, device="cuda")[::2])
    finally:
        dist.destroy_process_group()
