"""The torch adapter on torch older than the 2.13 CPU build it is tested with here: torch 2.11
(the GPU machine's) has no ``all_gather_single`` / ``reduce_scatter_single``, in
``torch.distributed`` or on a process group, and calls a backend by the older method names.
Both are checked without that torch: the fallback of ``denseccl.torch.single_tensor`` on a stand-in
of 2.11's ``torch.distributed``, and the process group driven through every method name 2.11's
``distributed_c10d.py`` calls on a group (read from its source), on one rank, against NumPy."""

from __future__ import annotations

import datetime
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch._C._distributed_c10d as c10d  # noqa: E402
import torch.distributed as dist  # noqa: E402

from denseccl.config import MPI_LAUNCH_VARIABLES  # noqa: E402
from denseccl.torch import single_tensor  # noqa: E402
from denseccl.torch.process_group import ProcessGroupDenseCCL  # noqa: E402

#: the collective methods torch 2.11's ``distributed_c10d.py`` calls on a process group whose
#: names torch 2.13 changed (2.13 calls ``all_gather_single``, ``reduce_scatter_single``,
#: ``all_to_all_single`` and their ``_coalesced`` forms instead)
TORCH_2_11_NAMES = (
    "_allgather_base",
    "_reduce_scatter_base",
    "alltoall_base",
    "allgather_into_tensor_coalesced",
    "reduce_scatter_tensor_coalesced",
)


def test_spellings_fall_back_to_the_old_names():
    def old_gather(*args):
        return ("old gather", args)

    def old_scatter(*args):
        return ("old scatter", args)

    def new_gather(*args):
        return ("new gather", args)

    def new_scatter(*args):
        return ("new scatter", args)

    torch_2_11 = types.SimpleNamespace(all_gather_into_tensor=old_gather, reduce_scatter_tensor=old_scatter)
    assert single_tensor.single_tensor_collectives(torch_2_11) == (old_gather, old_scatter)
    torch_2_13 = types.SimpleNamespace(
        all_gather_into_tensor=old_gather, reduce_scatter_tensor=old_scatter,
        all_gather_single=new_gather, reduce_scatter_single=new_scatter,
    )
    assert single_tensor.single_tensor_collectives(torch_2_13) == (new_gather, new_scatter)


def test_spellings_of_this_torch():
    gather, scatter = single_tensor.single_tensor_collectives(dist)
    assert (single_tensor.all_gather_single, single_tensor.reduce_scatter_single) == (gather, scatter)
    new = hasattr(dist, "all_gather_single")
    assert gather is (dist.all_gather_single if new else dist.all_gather_into_tensor)


@pytest.fixture
def group(monkeypatch):
    """A one-rank denseccl group with no MPI launcher (its CPU tensors move over gloo)."""
    for name in MPI_LAUNCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    pg = ProcessGroupDenseCCL(dist.HashStore(), 0, 1, datetime.timedelta(seconds=10))
    yield pg
    pg.shutdown()


def test_the_group_defines_every_name_torch_2_11_calls():
    """Defined by denseccl's classes themselves: torch 2.13's C++ base class also binds the old
    names (forwarding to the new ones), so an inherited one would pass here; on 2.11 the old
    names are the ones a Python process group must define."""
    ours = [k for k in ProcessGroupDenseCCL.__mro__ if k.__module__.startswith("denseccl.")]
    missing = [name for name in TORCH_2_11_NAMES if not any(callable(vars(k).get(name)) for k in ours)]
    assert not missing, f"torch 2.11 calls these, which the process group does not define: {missing}"


def test_the_old_method_names_compute(group):
    """Each call as torch 2.11's ``distributed_c10d.py`` makes it, on non-contiguous layouts,
    against NumPy (one rank: a gather and an all-to-all copy, a reduce-scatter sums one block)."""
    x = torch.arange(12.0).view(3, 4).t()  # (4, 3), column-major
    reference = x.numpy().copy()

    gathered = torch.full((3, 4), -1.0).t()  # the dim-0 concatenation of one block, in x's layout
    group._allgather_base(gathered, x, c10d.AllgatherOptions()).wait()
    np.testing.assert_array_equal(gathered.numpy(), reference)

    scattered = torch.full((4, 3), -1.0)
    options = c10d.ReduceScatterOptions()
    options.reduceOp = c10d.ReduceOp.SUM
    group._reduce_scatter_base(scattered, x, options).wait()
    np.testing.assert_array_equal(scattered.numpy(), reference)

    exchanged = torch.full((4, 3), -1.0)
    group.alltoall_base(exchanged, x.contiguous(), [], [], c10d.AllToAllOptions()).wait()
    np.testing.assert_array_equal(exchanged.numpy(), reference)

    outputs = [torch.full((4, 3), -1.0), torch.full((2,), -1.0)]
    inputs = [x, torch.tensor([5.0, 6.0])]
    group.allgather_into_tensor_coalesced(outputs, inputs).wait()
    np.testing.assert_array_equal(outputs[0].numpy(), reference)
    np.testing.assert_array_equal(outputs[1].numpy(), [5.0, 6.0])

    outputs = [torch.full((4, 3), -1.0), torch.full((2,), -1.0)]
    group.reduce_scatter_tensor_coalesced(outputs, inputs, options).wait()
    np.testing.assert_array_equal(outputs[0].numpy(), reference)
    np.testing.assert_array_equal(outputs[1].numpy(), [5.0, 6.0])
