"""The functional collectives that reach a denseccl group only through C++ methods torch's
process-group trampoline does not forward to Python, routed to the group's Python methods
(docs/torch.md, torch internals).

torch's ``PyProcessGroup`` (the C++ face of a Python ``ProcessGroup`` subclass) forwards some
virtual methods to Python (allreduce, broadcast, allgather, the coalesced gathers and
reduce-scatters, all_to_all_single, barrier, send, recv), not the others: called from C++,
``all_gather_single`` becomes the dispatcher op ``c10d::_allgather_base_``, whose CPU and CUDA
kernels ask the group for its C++ backend of that device type, which a Python group has none
of ("No backend type associated with device type cpu"), and ``startCoalescing`` asks for it
directly. Of torch's functional collectives, ``all_gather_into_tensor_out`` (which inductor's
FSDP bucketing emits) calls the first, ``batch_p2p_ops`` (a compiled ``batch_isend_irecv``)
the second; every other one calls forwarded methods.

:func:`install` registers a kernel for those two ops at the ``BackendSelect`` dispatch key,
which every call passes through before the device's kernel (inference mode included): for a
denseccl group it calls the group's own methods, for any other group it hands the call on,
unchanged, to torch's kernel. That costs another backend's calls of these two ops, in a process
that also has a denseccl group, one Python call (tens of microseconds); torch's other ops are
not touched (a route for ``c10d::_allgather_base_`` would add that to every
``all_gather_into_tensor`` of every group). Installed when the first denseccl group is created.
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable, Dict, Optional, Tuple

import torch
import torch.distributed as dist
import torch._C._distributed_c10d as _c10d
from torch._C import DispatchKey
from torch._C._distributed_c10d import _register_work  # type: ignore[attr-defined]
from torch.distributed.distributed_c10d import _resolve_process_group

try:  # a C++ Work around a Python wait; torch 2.11 may not bind it
    from torch._C._distributed_c10d import PythonCallbackWork
except ImportError:
    PythonCallbackWork = None  # type: ignore[misc, assignment]

_lock = threading.Lock()
_library: Optional[Any] = None


def _held(work: dist.Work, tensor: Any) -> dist.Work:
    """A C++ Work whose ``wait`` runs ``work.wait`` (with the GIL): C++ may hold it after the
    Python Work is gone, and a C++ caller that waits holding the GIL (``wait_tensor``) must
    complete the operation itself, as the progress thread cannot run meanwhile. Without
    ``PythonCallbackWork`` the Python Work itself, whose C++ ``wait`` calls its Python one (the
    same, through pybind's trampoline), kept alive by ``tensor`` as long as C++ may wait on it."""
    if PythonCallbackWork is not None:
        return PythonCallbackWork(work.wait)
    tensor._denseccl_work = work
    return work


def _all_gather_into_tensor_out(group: Any, input: Any, group_size: int, _: Any, *, out: Any) -> Any:  # noqa: A002
    """torch's functional gather into ``out``, which calls the group's C++ ``all_gather_single``
    (not forwarded): the group's own method, its Work registered on ``out`` for ``wait_tensor``."""
    if group_size != group.size():
        raise ValueError(f"all_gather_into_tensor_out: group_size {group_size}, but the group has {group.size()} ranks")
    opts = _c10d.AllgatherOptions()
    opts.asyncOp = True
    _register_work(out, _held(group.all_gather_single(out, input, opts), out))
    return out


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
        _register_work(result, _held(work, result))
        results.append(result)
    return results


#: functional op -> (the position of its group's name among its arguments, the call of the
#: group's methods: the group first, then the op's own arguments)
ROUTES: Dict[str, Tuple[int, Callable[..., Any]]] = {
    "all_gather_into_tensor_out": (2, _all_gather_into_tensor_out),
    "batch_p2p_ops": (4, _batch_p2p_ops),
}


def _group(named: Any) -> Any:
    """The process group a functional op names (by its name, or the group itself)."""
    if isinstance(named, str):
        return _resolve_process_group(named)
    return dist.ProcessGroup.unbox(named)


def _route(name: str, owner: type, keyset: Any, *args: Any, **kwargs: Any) -> Any:
    at, call = ROUTES[name]
    # meta tensors (a compiler tracing with fake tensors) take torch's meta kernel: nothing moves
    if not keyset.has(DispatchKey.Meta):
        group = _group(args[at])
        if isinstance(group, owner):
            return call(group, *args, **kwargs)
    op = getattr(torch.ops._c10d_functional, name).default
    return op.redispatch(keyset.remove(DispatchKey.BackendSelect), *args, **kwargs)


def install(owner: type) -> None:
    """Route the ops of :data:`ROUTES` on groups of class ``owner`` to their methods (once per
    process; idempotent). The kernels stay registered for the process's life."""
    global _library
    with _lock:
        if _library is not None:
            return
        library = torch.library.Library("_c10d_functional", "IMPL")
        for name in ROUTES:
            library.impl(name, functools.partial(_route, name, owner), "BackendSelect", with_keyset=True)
        _library = library


def uninstall() -> None:
    """Give torch's own kernels back the routed ops (to measure what the routes cost)."""
    global _library
    with _lock:
        if _library is not None:
            _library._destroy()
        _library = None


__all__ = ["ROUTES", "install", "uninstall"]

