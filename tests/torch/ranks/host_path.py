"""Rank program: the shared-memory engine (denseccl/backends/shm) that the gloo engine hands its
small calls to, under torchrun or mp.spawn.

usage: host_path.py [spawn N | paused | layouts CASES.json]   (torchrun sets the ranks; "spawn N" starts N itself)

Every result against a reference built from every rank's inputs, reduced in rank order in the
dtype (the order the host path promises), and compared across ranks bit for bit:
- repeated in-place allreduces (the prepared call) of every dtype the gloo engine reduces with
  every op it defines, on channels-last, permuted and negatively strided inputs (torch and
  NumPy), fresh inputs on every call, with random pauses of a few hundred microseconds on some
  ranks so that ranks run ahead of each other; none of them is a gloo call (but a PreMulSum's,
  which the communicator validates on every call);
- repeated in-place reduce and broadcast, every root: the same, and a non-root's reduce input
  left as it was;
- a rank on the general path (a tensor subclass) while the others replay: the first-call form
  moves through the same slots, no gloo call; a rank whose engine refuses a call that its peers
  take: every rank falls back to gloo for that call, results right;
- barriers: a rank late to one holds every peer there, and none is a gloo call;
- a layout mismatch on a replayed geometry: MismatchError on every rank, buffers untouched,
  the communicator usable;
- a call above DENSECCL_HOST_PATH bytes, and the agreement step off: gloo;
- with DENSECCL_HOST_PATH=0 in the environment: no host path at all;
- paused: a rank stopped between the step and its reduce (see :func:`paused`);
- layouts: drawn layouts, dtypes, ops and roots of every collective but all-to-all (see :func:`layouts`).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List

import numpy as np
import torch

import denseccl
from denseccl.ops import PreMulSum
from tests.mpi.ranks.common import (
    as_denseccl_op, build, compare, describe, load_cases, same_values, strides_for, values,
)
from tests.support.checker import Checker
from tests.support.layouts import assign, to_numpy
from tests.torch.ranks.common import start

OPS: Dict[str, List[Any]] = {
    "float32": ["sum", "prod", "min", "max", "avg", PreMulSum(0.5)],
    "float64": ["sum", "avg"],
    "float16": ["sum", "max", PreMulSum(0.25)],
    "bfloat16": ["sum", "min", "avg"],
    "int64": ["sum", "prod", "min", "max", "avg", PreMulSum(3)],
    "int32": ["sum", "max"],
    "int8": ["sum", "min"],
    "uint8": ["sum", "max"],
    "bool": ["sum", "prod", "min", "max"],
    "complex64": ["sum", "avg", PreMulSum(2.0)],
}
#: the layouts: how a (2, 3, 4, 5) tensor is laid out in memory
LAYOUTS: Dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "contiguous": lambda t: t,
    "channels-last": lambda t: t.contiguous(memory_format=torch.channels_last),
    "permuted": lambda t: t.permute(2, 0, 3, 1).contiguous().permute(1, 3, 0, 2),
}


def inputs(seed: int, rank: int, dtype: torch.dtype) -> torch.Tensor:
    """Rank ``rank``'s input of call ``seed``: small values, so that products stay exact enough."""
    generator = torch.Generator().manual_seed(seed * 1009 + rank)
    if dtype is torch.bool:
        return torch.rand((2, 3, 4, 5), generator=generator) < 0.5
    if dtype.is_complex:
        real, imaginary = (torch.rand((2, 3, 4, 5), generator=generator) for _ in range(2))
        return torch.complex(real, imaginary).to(dtype)
    if dtype.is_floating_point:
        return (torch.rand((2, 3, 4, 5), generator=generator, dtype=torch.float64) * 2 + 0.5).to(dtype)
    return torch.randint(1, 4, (2, 3, 4, 5), generator=generator).to(dtype)


def reference(seed: int, size: int, dtype: torch.dtype, op: Any) -> torch.Tensor:
    """Every rank's input reduced in rank order, in the dtype."""
    parts = [inputs(seed, r, dtype) for r in range(size)]
    if isinstance(op, PreMulSum):
        factor = op.factor if dtype.is_floating_point or dtype.is_complex else int(op.factor)
        parts = [torch.mul(p, factor).to(dtype) for p in parts]
    kind = "sum" if isinstance(op, PreMulSum) else op
    if dtype is torch.bool:
        kind = {"sum": "max", "prod": "min"}.get(kind, kind)
    combine = {"sum": torch.add, "avg": torch.add, "prod": torch.mul, "min": torch.minimum, "max": torch.maximum}[kind]
    out = combine(parts[0], parts[1])
    for part in parts[2:]:
        out = combine(out, part)
    if kind == "avg":
        out = out / size if dtype.is_floating_point or dtype.is_complex else torch.div(out, size, rounding_mode="trunc")
    return out.to(dtype)


class Counted:
    """Counts a communicator's gloo calls: allreduces (``calls``) and every collective with them
    (``gloo``). The shared-memory engine makes none."""

    def __init__(self, transport: Any) -> None:
        self.calls = self.gloo = 0
        for name in ("allreduce", "reduce", "broadcast", "allgather", "reduce_scatter", "barrier"):
            setattr(transport, name, self.counting(getattr(transport, name), name == "allreduce"))

    def counting(self, original: Callable[..., Any], allreduce: bool) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls += allreduce
            self.gloo += 1
            return original(*args, **kwargs)

        return counted


def same_everywhere(comm: denseccl.Communicator, x: torch.Tensor) -> bool:
    """Whether every rank holds the same bits in ``x``."""
    mine = x.contiguous().reshape(-1).view(torch.uint8).numpy().copy()
    every = comm.allgather(mine)
    return all(np.array_equal(block, every[0]) for block in every)


def same_bits_everywhere(comm: denseccl.Communicator, x: np.ndarray) -> bool:
    """Whether every rank holds the same bits in the NumPy array ``x`` (any shape, even empty)."""
    mine = np.frombuffer(np.ascontiguousarray(x).tobytes(), dtype=np.uint8).copy()
    every = comm.allgather(mine) if mine.size else [mine]
    return all(np.array_equal(block, every[0]) for block in every)


def replays(check: Checker, comm: denseccl.Communicator, counted: Counted, rank: int, size: int) -> None:
    shaker = random.Random(rank)
    seed = 0
    for name, ops in OPS.items():
        dtype = getattr(torch, name)
        for op in ops:
            for layout, lay in LAYOUTS.items():
                x = lay(inputs(0, rank, dtype))
                comm.allreduce(x, op=op)  # the first call: the general path, then prepared
                before = counted.calls
                for call in range(4):
                    seed += 1
                    x.copy_(inputs(seed, rank, dtype))  # in place: the same span, the prepared call
                    if shaker.random() < 0.3:  # this rank runs behind its peers for a while
                        time.sleep(shaker.uniform(0.0001, 0.0008))
                    comm.allreduce(x, op=op)
                    want = reference(seed, size, dtype, op)
                    exact = torch.equal(x, want)
                    close = exact or (dtype.is_floating_point or dtype.is_complex) and torch.allclose(
                        x.to(torch.complex128 if dtype.is_complex else torch.float64),
                        want.to(torch.complex128 if dtype.is_complex else torch.float64), rtol=1e-2,
                    )
                    check.check(close, f"{name} {op} {layout} call {call}: differs from the reference")
                    check.check(same_everywhere(comm, x), f"{name} {op} {layout} call {call}: ranks differ")
                gloo, expected = counted.calls - before, 4 if isinstance(op, PreMulSum) else 0  # never cached
                check.check(gloo == expected, f"{name} {op} {layout}: {gloo} gloo calls in replays, not {expected}")


def back_to_back(check: Checker, comm: denseccl.Communicator, counted: Counted, rank: int, size: int) -> None:
    """Calls with nothing between them: a rank that finished a call copies its next input while
    a slower peer may still be reducing the last (the slots' two halves keep them apart)."""
    x = torch.zeros(4096)
    comm.allreduce(x)
    before, wrong = counted.calls, []
    total = sum(range(1, size + 1))
    for call in range(3000):
        x.fill_(float(call * (rank + 1)))
        comm.allreduce(x)
        if not torch.all(x == float(call * total)):
            wrong.append(call)
    check.check(not wrong, f"back to back: {len(wrong)} of 3000 calls wrong, the first {wrong[:5]}")
    check.check(counted.calls == before, f"back to back: {counted.calls - before} gloo calls")


def rooted(check: Checker, comm: denseccl.Communicator, counted: Counted, rank: int, size: int) -> None:
    """Repeated in-place reduce and broadcast, every root: the root's result (reduce) or every
    rank's copy of the root's input (broadcast); a non-root's reduce input left as it was."""
    seed = 5000
    for name, op in (("float32", "sum"), ("bfloat16", "max"), ("int64", "avg"), ("bool", "prod")):
        dtype = getattr(torch, name)
        for root in range(size):
            for layout, lay in LAYOUTS.items():
                x = lay(inputs(0, rank, dtype))
                comm.reduce(x, root=root, op=op)
                y = lay(inputs(0, rank, dtype))
                comm.broadcast(y, root=root)
                before = counted.calls
                for call in range(3):
                    seed += 1
                    x.copy_(inputs(seed, rank, dtype))
                    comm.reduce(x, root=root, op=op)
                    want = reference(seed, size, dtype, op) if rank == root else inputs(seed, rank, dtype)
                    check.check(torch.equal(x, want), f"reduce {name} {op} root {root} {layout} call {call}: differs")
                    y.copy_(inputs(seed, rank, dtype))
                    comm.broadcast(y, root=root)
                    want = inputs(seed, root, dtype)
                    check.check(torch.equal(y, want), f"broadcast {name} root {root} {layout} call {call}: differs")
                gloo = counted.gloo - before
                check.check(gloo == 0, f"reduce/broadcast {name} root {root} {layout}: {gloo} gloo calls in replays")


def numpy_layouts(check: Checker, comm: denseccl.Communicator, counted: Counted, rank: int, size: int) -> None:
    x = np.zeros((4, 6), np.float64)[::-1].T  # negative strides, transposed: dense
    before = None
    for call in range(20):
        x[...] = np.arange(24, dtype=np.float64).reshape(6, 4) * (rank + 1) + call
        comm.allreduce(x)
        if call == 1:
            before = counted.calls
        want = np.arange(24, dtype=np.float64).reshape(6, 4) * sum(range(1, size + 1)) + call * size
        check.check(np.array_equal(x, want), f"numpy negative strides call {call}: differs")
    check.check(counted.calls == before, "numpy negative strides: gloo calls in replays")


def mixed(check: Checker, comm: denseccl.Communicator, counted: Counted, rank: int, size: int) -> None:
    x = torch.ones(64)
    comm.allreduce(x)
    comm.allreduce(x)  # prepared on every rank
    before = counted.calls
    y = torch.nn.Parameter(torch.ones(64), requires_grad=False) if rank == 0 else x
    with torch.no_grad():
        y.fill_(float(rank + 1))
        comm.allreduce(y)  # rank 0: the first-call form, through the same slots
    check.check(torch.equal(y.detach(), torch.full((64,), float(sum(range(1, size + 1))))), f"mixed: {y[:4]}")
    check.check(counted.calls == before, f"mixed: {counted.calls - before} gloo calls, expected none")
    host = comm.flow.transport.host
    limit = host.limit
    if rank == 0:  # this rank's engine refuses the call its peers take (posts UNPLANNED): all fall back
        host.limit = 0
    z = torch.ones(32)
    for call in range(3):
        z.fill_(float(rank + 1 + call))
        comm.allreduce(z)
        want = float(sum(range(1, size + 1)) + size * call)
        check.check(torch.equal(z, torch.full((32,), want)), f"refused on rank 0, call {call}: {z[:4]}")
    host.limit = limit
    check.check(counted.calls == before + 3, f"refused: {counted.calls - before} gloo calls, expected the fallback's 3")


def barriers(check: Checker, comm: denseccl.Communicator, counted: Counted, rank: int, size: int) -> None:
    """A barrier holds every rank until the last arrives (rank 0, 0.3 s late); none is a gloo call."""
    comm.barrier()
    before = counted.gloo
    for late in range(2):
        if rank == 0:
            time.sleep(0.3)
        began = time.monotonic()
        comm.barrier()
        held = time.monotonic() - began
        check.check(rank == 0 or held > 0.2, f"barrier {late}: rank {rank} left after {held:.3f} s, before rank 0 came")
    check.check(counted.gloo == before, f"barriers: {counted.gloo - before} gloo calls")


def mismatch(check: Checker, comm: denseccl.Communicator, rank: int, size: int) -> None:
    x = torch.full((4, 3), 2.0).t()
    comm.allreduce(x)
    comm.allreduce(x)  # prepared
    z = torch.full((3, 4), 5.0) if rank == size - 1 else x.fill_(5.0)  # another layout on the last rank
    check.raises("mismatch", denseccl.MismatchError, lambda: comm.allreduce(z), "mismatch")
    check.check(bool((z == 5).all()), "mismatch: a buffer was written before the error")
    x.fill_(1.0)
    comm.allreduce(x)
    check.check(torch.equal(x, torch.full((3, 4), float(size))), "mismatch: unusable after the error")


def on_gloo(check: Checker, comm: denseccl.Communicator, numel: int, what: str) -> None:
    """Three repeated allreduces of ``numel`` float32 on ``comm``: right, and each a gloo call."""
    counted = Counted(comm.flow.transport)
    x = torch.ones(numel)
    for _ in range(3):
        x.fill_(float(comm.rank + 1))
        comm.allreduce(x)
    right = torch.equal(x, torch.full_like(x, float(sum(range(1, comm.size + 1)))))
    check.check(right and counted.calls == 3, f"{what}: {x[:4]}, {counted.calls} gloo calls of 3")
    comm.close()


def gloo_only(check: Checker) -> None:
    """A call one element over the limit, and the agreement step off: gloo (gathers, scatters
    and barriers too: with no step there is nothing to order the slots)."""
    on_gloo(check, denseccl.init(backend="gloo"), denseccl.config.settings().host_path // 4 + 1, "over the limit")
    on_gloo(check, denseccl.init(backend="gloo", check="off"), 16, "check off")
    comm = denseccl.init(backend="gloo", check="off")
    counted = Counted(comm.flow.transport)
    size, rank = comm.size, comm.rank
    for call in range(2):
        comm.barrier()
        every = comm.allgather(torch.full((8,), float(rank + call)))
        check.check(torch.equal(every[:, 0], torch.arange(size, dtype=torch.float32) + call), f"check off: {every}")
        part = comm.reduce_scatter(torch.ones(size, 8) * (rank + 1))
        check.check(torch.equal(part, torch.full((8,), float(sum(range(1, size + 1))))), f"check off: {part}")
    check.check(counted.gloo == 6, f"check off: {counted.gloo} gloo calls of barriers, gathers and scatters, not 6")
    comm.close()


def turned_off(check: Checker) -> None:
    """DENSECCL_HOST_PATH=0: no data area, every call through gloo."""
    comm = denseccl.init(backend="gloo")
    check.check(comm.flow.transport.host is None, "DENSECCL_HOST_PATH=0: a host path all the same")
    on_gloo(check, comm, 16, "DENSECCL_HOST_PATH=0")


def paused(check: Checker, rank: int, size: int) -> None:
    """The last rank stops (SIGSTOP) right after the step of a call on the host path, before it
    reduces; a helper resumes it (SIGCONT) 4 s later. Its peers finish that call, time out in the
    next one (2 s) and give up. Resumed, the last rank reduces the first call from slots its
    peers did not overwrite (their next call went to the other half): the right result, and
    then CommunicatorBrokenError for it all the same (a peer gave up meanwhile); its next call
    fails at once on the flag. No failed call writes its buffer."""
    comm = denseccl.init(backend="gloo", timeout=2)
    x = torch.zeros(256)
    for _ in range(2):
        comm.allreduce(x)  # prepared from the second call on
    x.fill_(float(rank + 1))
    if rank == size - 1:
        control = comm.flow.control
        agree = control.all_equal

        def stop_after(*args: Any) -> Any:
            answer = agree(*args)
            control.all_equal = agree  # once
            subprocess.Popen(["sh", "-c", f"sleep 4; kill -CONT {os.getpid()}"])
            os.kill(os.getpid(), signal.SIGSTOP)
            return answer

        control.all_equal = stop_after
    total = float(sum(range(1, size + 1)))
    if rank == size - 1:  # its call completed, but a peer gave up meanwhile: the flow says so
        check.raises("the paused call", denseccl.CommunicatorBrokenError, lambda: comm.allreduce(x), "gave up")
    else:
        comm.allreduce(x)
    check.check(torch.equal(x, torch.full((256,), total)), f"paused: the call the last rank paused in gave {x[:4]}")
    x.fill_(100.0)
    if rank == size - 1:
        check.raises("the late rank's next call", denseccl.CommunicatorBrokenError, lambda: comm.allreduce(x))
    else:
        check.raises("the next call", (denseccl.CollectiveTimeoutError, denseccl.CommunicatorBrokenError),
                     lambda: comm.allreduce(x))
    check.check(torch.equal(x, torch.full((256,), 100.0)), "paused: a failed call wrote its buffer")


def layouts(check: Checker, rank: int, size: int, path: str) -> None:
    """Cases from a JSON file (tests/torch/test_host_path.py draws them with hypothesis): each
    collective on its layout three times in place, the first on the general path, the others
    replayed (on the host path where it fits), every result against the reference built from
    every rank's inputs as read back from arrays of that layout."""
    comm = denseccl.init(backend="gloo")
    counted = Counted(comm.flow.transport)
    limit = denseccl.config.settings().host_path
    for case in load_cases(path):
        case = dict(case, size=size)
        shape, strides, dtype, collective = tuple(case["shape"]), strides_for(case), case["dtype"], case["collective"]
        raw, root, what = case.get("op"), case["root"] % size, describe(case)
        op = None if raw is None else as_denseccl_op(raw)
        if collective in ("allgather", "reduce_scatter", "barrier"):
            gathers(check, comm, counted, case, rank, size, limit)
            continue
        x = build(case, values(case, rank, shape), strides)
        for salt in range(3):
            inputs = [to_numpy(build(case, values(case, r, shape, salt), strides)) for r in range(size)]
            assign(x, values(case, rank, shape, salt))
            before = counted.gloo
            if collective == "broadcast":
                comm.broadcast(x, root=root)
                check.check(same_values(to_numpy(x), inputs[root]), f"{what} call {salt}: broadcast differs")
            elif collective == "reduce":
                comm.reduce(x, root=root, op=op)
                if rank == root:
                    compare(check, f"{what} call {salt}", to_numpy(x), inputs, dtype, raw, size)
                else:
                    check.check(same_values(to_numpy(x), inputs[rank]), f"{what} call {salt}: a non-root input changed")
            else:
                comm.allreduce(x, op=op)
                compare(check, f"{what} call {salt}", to_numpy(x), inputs, dtype, raw, size)
                check.check(same_bits_everywhere(comm, to_numpy(x)), f"{what} call {salt}: ranks differ")
            nbytes = x.nbytes if isinstance(x, np.ndarray) else x.numel() * x.element_size()
            if 0 < nbytes <= limit and not isinstance(raw, dict):  # a PreMulSum: gloo
                check.check(counted.gloo == before, f"{what} call {salt}: a gloo call, not shared memory")
    comm.close()


def gathers(
    check: Checker, comm: denseccl.Communicator, counted: Counted, case: Dict[str, Any], rank: int, size: int,
    limit: int,
) -> None:
    """One drawn allgather, reduce-scatter or barrier three times: the first into a new stacked
    array, the others into a given one (the stacked array of the first call: the into-tensor
    form), or from a stacked input into a new array, then into a given one. Results against
    every rank's inputs; through shared memory (no gloo call) where the bytes fit a slot."""
    shape, strides, dtype, collective = tuple(case["shape"]), strides_for(case), case["dtype"], case["collective"]
    raw, what = case.get("op"), describe(case)
    op = None if raw is None else as_denseccl_op(raw)
    numel = int(np.prod(shape)) if shape else 1
    itemsize = np.dtype("float32" if dtype == "bfloat16" else dtype).itemsize // (2 if dtype == "bfloat16" else 1)
    out: Any = None
    for salt in range(3):
        before = counted.gloo
        if collective == "barrier":
            comm.barrier()
            fits = True
        elif collective == "allgather":
            inputs = [to_numpy(build(case, values(case, r, shape, salt), strides)) for r in range(size)]
            x = build(case, values(case, rank, shape, salt), strides)
            out = comm.allgather(x, out=out)
            for r in range(size):
                check.check(same_values(to_numpy(out[r, ...]), inputs[r]), f"{what} call {salt}: block {r} differs")
            fits = numel * itemsize <= limit
        else:
            stacked_shape, stacked_strides = (size, *shape), (numel, *strides)
            full = [values(case, r, stacked_shape, salt) for r in range(size)]
            inputs = [to_numpy(build(case, full[r][rank, ...], strides)) for r in range(size)]
            x = build(case, full[rank], stacked_strides)
            out = comm.reduce_scatter(x, op=op, out=out)
            compare(check, f"{what} call {salt}", to_numpy(out), inputs, dtype, raw, size)
            fits = size * numel * itemsize <= limit and not isinstance(raw, dict)
        if fits and numel:
            check.check(counted.gloo == before, f"{what} call {salt}: a gloo call, not shared memory")


def main(rank: int, size: int) -> None:
    torch.set_num_threads(1)
    check = Checker("host-path", rank, size)
    if os.environ.get("DENSECCL_HOST_PATH") == "0":
        turned_off(check)
        check.done()
        return
    if sys.argv[1:2] == ["paused"]:
        paused(check, rank, size)
        check.done()
        return
    if sys.argv[1:2] == ["layouts"]:
        layouts(check, rank, size, sys.argv[2])
        check.done()
        return
    comm = denseccl.init(backend="gloo")
    transport = comm.flow.transport
    check.check(getattr(transport, "host", None) is not None, "no host path on one host")
    counted = Counted(transport)
    back_to_back(check, comm, counted, rank, size)
    replays(check, comm, counted, rank, size)
    rooted(check, comm, counted, rank, size)
    numpy_layouts(check, comm, counted, rank, size)
    mixed(check, comm, counted, rank, size)
    barriers(check, comm, counted, rank, size)
    mismatch(check, comm, rank, size)
    comm.close()
    gloo_only(check)
    check.done()


if __name__ == "__main__":
    start(main, int(sys.argv[2]) if sys.argv[1:2] == ["spawn"] else None)
