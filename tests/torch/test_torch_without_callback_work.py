"""The torch adapter on a torch without ``torch._C._distributed_c10d.PythonCallbackWork`` (which
torch 2.11, the GPU machine's, may not bind): ``import denseccl.torch`` must work (it is the
first step of the GPU run), and the routed functional gather must still compute. Run in a
fresh interpreter with the name removed before denseccl is imported."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

PROGRAM = r"""
import datetime
import torch, torch._C._distributed_c10d as c10d
import torch.distributed as dist
F = torch.ops._c10d_functional
del c10d.PythonCallbackWork  # what a torch without it offers
import denseccl.torch  # registers the backend; must not fail
from denseccl.torch import dispatcher
assert dispatcher.PythonCallbackWork is None
store = dist.HashStore()
dist.init_process_group("denseccl", store=store, rank=0, world_size=1, timeout=datetime.timedelta(seconds=20))
x = torch.arange(12.0).view(3, 4).t()  # (4, 3), column-major
out = torch.full((4, 3), -1.0)
got = F.wait_tensor(F.all_gather_into_tensor_out(x, 1, dist.group.WORLD.group_name, out=out))
assert torch.equal(got, x.contiguous()) and torch.equal(out, x), (got, x)
dist.destroy_process_group()
print("OK")
"""


def test_adapter_without_python_callback_work():
    root = Path(__file__).resolve().parents[2]
    env = {"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin", "DENSECCL_TIMEOUT": "20"}
    done = subprocess.run([sys.executable, "-c", PROGRAM], cwd=root, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout.strip().endswith("OK"), done.stdout[-2000:] + done.stderr[-4000:]
