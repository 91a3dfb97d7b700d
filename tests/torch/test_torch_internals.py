"""The torch internals the denseccl backend depends on, probed one by one in one process: a
torch upgrade that removes or changes one fails here, loudly, naming it and pointing to
docs/torch.md ("torch internals the backend depends on"), before a rank test fails somewhere
less obvious. Each probe checks the name and, where it is cheap, the behaviour relied on."""

from __future__ import annotations

import datetime
import inspect
from typing import Callable, List, Tuple

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

import torch._C._distributed_c10d as c10d  # noqa: E402

pytestmark = pytest.mark.torch

DOCS = "docs/torch.md, section 'torch internals the backend depends on'"


def _registration() -> None:
    parameters = inspect.signature(dist.Backend.register_backend).parameters
    assert {"extended_api", "devices"} <= set(parameters), f"register_backend takes {list(parameters)}"
    options = c10d._DistributedBackendOptions()
    for field in ("store", "group_rank", "group_size", "timeout", "global_ranks_in_group", "group_id"):
        assert hasattr(options, field), f"_DistributedBackendOptions has no {field}"


class _Probe(dist.ProcessGroup):
    """A Python process group whose allreduce records that C++ called it."""

    def __init__(self) -> None:
        super().__init__(0, 1)
        self.called: List[str] = []

    def allreduce(self, tensors, opts=None):
        self.called.append("allreduce")
        future = torch.futures.Future()
        future.set_result(tensors)
        return c10d._create_work_from_future(future)


def _trampoline() -> None:
    group = _Probe()
    # torch's binding of the base class calls the C++ virtual method, which the trampoline
    # forwards to the Python override
    dist.ProcessGroup.allreduce(group, [torch.ones(2)], c10d.AllreduceOptions()).wait()
    assert group.called == ["allreduce"], "the trampoline did not forward allreduce to Python"


#: the base-class names the group overrides, which torch's Python code calls on it
OVERRIDDEN = (
    "allreduce", "allreduce_coalesced", "reduce", "broadcast", "barrier", "allgather", "allgather_coalesced",
    "all_gather_single", "_allgather_base", "all_gather_single_coalesced", "allgather_into_tensor_coalesced",
    "reduce_scatter", "reduce_scatter_single", "_reduce_scatter_base", "reduce_scatter_single_coalesced",
    "reduce_scatter_tensor_coalesced", "gather", "scatter", "all_to_all_single", "alltoall_base", "alltoall",
    "send", "recv", "recv_anysource", "_start_coalescing", "_end_coalescing", "shutdown", "abort", "name",
    "_get_sequence_number_for_group", "_set_sequence_number_for_group", "_device_types", "_get_backend",
)


def _overridden_names() -> None:
    missing = [name for name in OVERRIDDEN if not hasattr(dist.ProcessGroup, name)]
    assert not missing, f"torch's ProcessGroup no longer has {missing}: the group's overrides are no longer called"


def _options() -> None:
    fields = {
        "AllreduceOptions": ("reduceOp", "asyncOp", "timeout"), "AllreduceCoalescedOptions": ("reduceOp",),
        "ReduceOptions": ("reduceOp", "rootRank"), "BroadcastOptions": ("rootRank",), "BarrierOptions": (),
        "AllgatherOptions": ("asyncOp",), "ReduceScatterOptions": ("reduceOp", "asyncOp"), "AllToAllOptions": (),
        "GatherOptions": ("rootRank",), "ScatterOptions": ("rootRank",),
    }
    for name, needed in fields.items():
        opts = getattr(c10d, name)()
        for field in needed:
            assert hasattr(opts, field), f"{name} has no {field}"


def _works() -> None:
    future = torch.futures.Future()
    future.set_result([])
    assert c10d._create_work_from_future(future).wait()
    waited: List[object] = []
    work = c10d.PythonCallbackWork(lambda timeout: waited.append(timeout) or True)
    work.wait(datetime.timedelta(seconds=1))
    assert waited, "PythonCallbackWork did not call its callback on wait"
    assert callable(c10d._register_work)
    assert issubclass(type("W", (dist.Work,), {}), dist.Work)


def _functional() -> None:
    from denseccl.torch.dispatcher import ROUTES

    for name, (at, _call) in ROUTES.items():
        schema = getattr(torch.ops._c10d_functional, name).default._schema
        argument = schema.arguments[at]
        assert argument.name == "group_name", f"_c10d_functional.{name}: argument {at} is {argument.name}: {schema}"
    assert hasattr(torch._C.DispatchKey, "BackendSelect")
    assert "with_keyset" in inspect.signature(torch.library.Library.impl).parameters
    assert hasattr(torch.library.Library, "_destroy"), "Library._destroy (dispatcher.uninstall) is gone"
    assert hasattr(torch.ops._c10d_functional.all_reduce.default, "redispatch")
    assert hasattr(dist.ProcessGroup, "unbox")
    from torch.distributed.distributed_c10d import _resolve_process_group

    assert callable(_resolve_process_group)


def _rendezvous() -> None:
    import importlib

    module = importlib.import_module("torch.distributed.rendezvous")
    assert isinstance(module._rendezvous_handlers, dict) and "env" in module._rendezvous_handlers
    assert callable(module.register_rendezvous_handler)


def _profiler() -> None:
    from torch._C._autograd import _profiler_enabled
    from torch._C._profiler import _RecordFunctionFast

    assert _profiler_enabled() is False
    with torch.profiler.profile(record_shapes=True) as prof:
        with _RecordFunctionFast("denseccl:probe", [torch.ones(2, 3)]):
            pass
    events = [e for e in prof.events() if e.name == "denseccl:probe"]
    assert events and events[0].input_shapes == [[2, 3]], "_RecordFunctionFast recorded no range with shapes"


def _gloo_engine() -> None:
    if not dist.is_gloo_available():
        pytest.skip("this torch has no gloo")
    parameters = ("_set_default_timeout", "_allgather_base", "_reduce_scatter_base", "alltoall_base", "allreduce")
    missing = [name for name in parameters if not hasattr(dist.ProcessGroupGloo, name)]
    assert not missing, f"ProcessGroupGloo has no {missing}"
    assert hasattr(dist, "PrefixStore") and hasattr(dist, "TCPStore")
    base = torch.ones(2)
    view = base.view(-1)
    assert (base._use_count(), view._use_count()) == (2, 1), "Tensor._use_count (gloo/held.py) counts otherwise"


def _flatten() -> None:
    from torch._utils import _flatten_dense_tensors  # noqa: F401


PROBES: List[Tuple[str, str, Callable[[], None]]] = [
    ("Backend.register_backend(extended_api, devices) and _DistributedBackendOptions", "registration", _registration),
    ("the ProcessGroup trampoline forwarding a Python subclass's methods", "process-group trampoline", _trampoline),
    ("ProcessGroup's method names the group overrides", "process-group trampoline", _overridden_names),
    ("torch._C._distributed_c10d's option classes", "options", _options),
    ("_create_work_from_future, PythonCallbackWork, _register_work, dist.Work", "Work helpers", _works),
    ("_c10d_functional schemas, BackendSelect, Library.impl(with_keyset), redispatch", "functional", _functional),
    ("torch.distributed.rendezvous._rendezvous_handlers", "rendezvous handlers", _rendezvous),
    ("torch._C._autograd._profiler_enabled and torch._C._profiler._RecordFunctionFast", "profiler", _profiler),
    ("ProcessGroupGloo's methods, PrefixStore, TCPStore", "the gloo engine", _gloo_engine),
    ("torch._utils._flatten_dense_tensors", "coalesced buckets", _flatten),
]


@pytest.mark.parametrize("what, part, probe", PROBES, ids=[p[1] for p in PROBES])
def test_torch_internal_is_there(what, part, probe):
    try:
        probe()
    except (AssertionError, AttributeError, ImportError, TypeError, RuntimeError) as error:
        pytest.fail(
            f"torch {torch.__version__} changed an internal the denseccl backend depends on ({part}): {what}: "
            f"{type(error).__name__}: {error}. See {DOCS} for what uses it and the planned move "
            "(dist.BackendBase, TorchComms).",
            pytrace=False,
        )
