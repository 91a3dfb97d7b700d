"""torch's C++ calls of a denseccl group's collectives that torch's process-group trampoline
does not forward to Python, routed to the group's Python methods (docs/torch.md, torch
internals).

torch's ``PyProcessGroup`` (the C++ face of a Python ``ProcessGroup`` subclass) forwards only
some virtual methods to Python (allreduce, broadcast, allgather, the coalesced gathers and
reduce-scatters, all_to_all_single, barrier, send, recv). The others (``all_gather_single``,
``reduce_scatter_single``, ``reduce``, ``gather``, ``scatter``, ``alltoall``,
``allgather_coalesced``), when C++ calls them, become dispatcher ops (``c10d::_allgather_base_``
...) whose CPU and CUDA kernels ask the group for its C++ backend of that device type, which a
Python group has none of: "No backend type associated with device type cpu"; and
``startCoalescing`` asks for it directly. C++ makes such calls in torch's functional
collectives: ``_c10d_functional.all_gather_into_tensor_out`` (which inductor's FSDP bucketing
emits) and ``batch_p2p_ops`` (a compiled ``batch_isend_irecv``), which brackets its sends and
receives with ``startCoalescing``.

:func:`install` registers a kernel for those ops at the ``BackendSelect`` dispatch key, which
every call passes through before the device's kernel (inference mode included): for a denseccl
group it calls the group's method, for any other group it hands the call on, unchanged, to
torch's own kernel. Installed when the first denseccl group is created; from then on the ops
above cost any other backend's C++ callers in the process one Python call (microseconds).
"""

from __future__ import annotations

import datetime
import functools
import threading
from typing import Any, Callable, Dict, Optional

import torch
import torch.distributed as dist
import torch._C._distributed_c10d as _c10d
from torch._C import DispatchKey
from torch._C._distributed_c10d import PythonCallbackWork, _register_work  # type: ignore[attr-defined]
from torch.distributed.distributed_c10d import _resolve_process_group

#: the position of the process group among each routed op's arguments
_GROUP_AT = {
    "_allgather_base_": 2,
    "_reduce_scatter_base_": 2,
    "reduce_": 1,
    "gather_": 2,
    "scatter_": 2,
    "alltoall_": 2,
    "allgather_coalesced_": 2,
    "_c10d_functional::batch_p2p_ops": 4,
}

_lock = threading.Lock()
_library: Optional[Dict[str, Any]] = None


def _held(work: dist.Work) -> dist.Work:
    """A C++ Work whose ``wait`` runs ``work.wait`` (with the GIL): C++ may hold it after the
    Python Work is gone, and a C++ caller that waits holding the GIL (``wait_tensor``) must
    complete the operation itself, as the progress thread cannot run meanwhile."""
    return PythonCallbackWork(work.wait)


def _boxed(work: dist.Work) -> Any:
    """The group's Work as the dispatcher carries it."""
    return _held(work).boxed()


def _op(boxed: Any) -> dist.ReduceOp:
    """A reduce op from the dispatcher (a TorchScript object whose ``op()`` is its type)."""
    kind = dist.ReduceOp.RedOpType(boxed.op())
    if kind == dist.ReduceOp.RedOpType.PREMUL_SUM:  # its factor does not cross the dispatcher
        raise ValueError(
            "denseccl: PREMUL_SUM reaches the denseccl group through torch's C++ dispatcher without its factor; "
            "call the torch.distributed function (or the group's method) from Python instead"
        )
    return dist.ReduceOp(kind)


def _options(cls: Any, async_op: bool, timeout: int = -1, **fields: Any) -> Any:
    opts = cls()
    opts.asyncOp = bool(async_op)
    if timeout is not None and timeout >= 0:
        opts.timeout = datetime.timedelta(milliseconds=timeout)
    for name, value in fields.items():
        setattr(opts, name, value)
    return opts


def _allgather_base(group: Any, output: Any, input: Any, _: Any, async_op: bool = True, timeout: int = -1) -> Any:  # noqa: A002
    work = group.all_gather_single(output, input, _options(_c10d.AllgatherOptions, async_op, timeout))
    return output, _boxed(work)


def _reduce_scatter_base(
    group: Any, output: Any, input: Any, _: Any, op: Any, async_op: bool = True, timeout: int = -1  # noqa: A002
) -> Any:
    opts = _options(_c10d.ReduceScatterOptions, async_op, timeout, reduceOp=_op(op))
    return output, _boxed(group.reduce_scatter_single(output, input, opts))


def _reduce(
    group: Any, tensors: Any, _: Any, op: Any, root: int, root_tensor: int, async_op: bool = True, timeout: int = -1
) -> Any:
    opts = _options(_c10d.ReduceOptions, async_op, timeout, reduceOp=_op(op), rootRank=root, rootTensor=root_tensor)
    return _boxed(group.reduce(tensors, opts))


def _gather(group: Any, outputs: Any, inputs: Any, _: Any, root: int, async_op: bool = True, timeout: int = -1) -> Any:
    return _boxed(group.gather(outputs, inputs, _options(_c10d.GatherOptions, async_op, timeout, rootRank=root)))


def _scatter(group: Any, outputs: Any, inputs: Any, _: Any, root: int, async_op: bool = True, timeout: int = -1) -> Any:
    work = group.scatter(outputs, inputs, _options(_c10d.ScatterOptions, async_op, timeout, rootRank=root))
    return outputs, _boxed(work)


def _alltoall(group: Any, outputs: Any, inputs: Any, _: Any, async_op: bool = True, timeout: int = -1) -> Any:
    work = group.alltoall(outputs, inputs, _options(_c10d.AllToAllOptions, async_op, timeout))
    return outputs, _boxed(work)


def _allgather_coalesced(group: Any, outputs: Any, inputs: Any, _: Any, async_op: bool = True) -> Any:
    return _boxed(group.allgather_coalesced(outputs, inputs, _options(_c10d.AllgatherOptions, async_op)))


def _batch_p2p_ops(group: Any, kinds: Any, peers: Any, tags: Any, tensors: Any, _: Any) -> Any:
    """torch's functional ``batch_p2p_ops``, which brackets the sends and receives with the
    group's C++ ``startCoalescing`` / ``endCoalescing`` (not forwarded either): each one here
    is the group's own send or recv, its Work registered on the tensor ``wait_tensor`` is
    given (an empty tensor for a send, the buffer itself for a receive, as torch returns)."""
    results = []
    for kind, peer, tag, tensor in zip(kinds, peers, tags, tensors):
        if kind == "isend":
            work, result = group.send([tensor], peer, tag), tensor.new_empty(0)
        elif kind == "irecv":
            work, result = group.recv([tensor], peer, tag), tensor
        else:
            raise ValueError(f"batch_p2p_ops: unknown operation {kind!r} (isend and irecv are)")
        _register_work(result, _held(work))
        results.append(result)
    return results


#: op name -> the call of the group's method (the group first, then the op's own arguments)
ROUTES: Dict[str, Callable[..., Any]] = {
    "_allgather_base_": _allgather_base,
    "_reduce_scatter_base_": _reduce_scatter_base,
    "reduce_": _reduce,
    "gather_": _gather,
    "scatter_": _scatter,
    "alltoall_": _alltoall,
    "allgather_coalesced_": _allgather_coalesced,
    "_c10d_functional::batch_p2p_ops": _batch_p2p_ops,
}


def _route(name: str, owner: type, keyset: Any, *args: Any) -> Any:
    namespace, _, op_name = name.rpartition("::")
    if namespace:  # a functional op names its group
        group = _resolve_process_group(args[_GROUP_AT[name]])
    else:
        group = dist.ProcessGroup.unbox(args[_GROUP_AT[name]])
    if isinstance(group, owner):
        return ROUTES[name](group, *args)
    op = getattr(getattr(torch.ops, namespace or "c10d"), op_name).default
    return op.redispatch(keyset.remove(DispatchKey.BackendSelect), *args)


def install(owner: type) -> None:
    """Route the ops of :data:`ROUTES` on groups of class ``owner`` to their methods (once per
    process; idempotent). The libraries stay registered for the process's life."""
    global _library
    with _lock:
        if _library is not None:
            return
        libraries: Dict[str, Any] = {}
        for name in ROUTES:
            namespace, _, op_name = name.rpartition("::")
            library = libraries.get(namespace) or libraries.setdefault(
                namespace, torch.library.Library(namespace or "c10d", "IMPL")
            )
            library.impl(op_name, functools.partial(_route, name, owner), "BackendSelect", with_keyset=True)
        _library = libraries


def installed() -> bool:
    return _library is not None


__all__ = ["ROUTES", "install", "installed"]

