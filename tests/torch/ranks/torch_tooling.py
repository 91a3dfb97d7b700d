"""The backend in torch's tooling, side by side with gloo on the same ranks (issue 26): every
``_c10d_functional`` op (out-variants, point-to-point and torch's autograd wrappers
included), the group's device types
and backends, sequence numbers (the flight recorder's), and profiler ranges. Every result is
checked against a reference built from all ranks' inputs, and against gloo's answer.
Run with mpiexec -n N or torchrun --nproc-per-node N, with DENSECCL_TRACE_BUFFER set."""

from typing import Any, Callable, Dict, List

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fc

from tests.support.checker import Checker
from tests.torch.ranks.common import init, values

F = torch.ops._c10d_functional


def wait(result: Any) -> Any:
    if isinstance(result, (list, tuple)):
        return [F.wait_tensor(t) for t in result]
    return F.wait_tensor(result)


def functional_cases(rank: int, size: int) -> Dict[str, Callable[[str], Any]]:
    """op name -> a call of it on the group named by its argument, returning ``(got, want)``."""
    x = values(1, rank, (4, 3), torch.float32)
    each = [values(1, r, (4, 3), torch.float32) for r in range(size)]
    total = sum(each)
    gathered = torch.cat(each)
    stacked_in = values(2, rank, (size * 2, 3), torch.float32)
    stacked_each = [values(2, r, (size * 2, 3), torch.float32) for r in range(size)]
    scattered = sum(stacked_each)[rank * 2: rank * 2 + 2]
    transposed = values(3, rank, (3, 4), torch.float32).t()  # (4, 3), column-major
    gathered_t = torch.cat([values(3, r, (3, 4), torch.float32).t() for r in range(size)])
    a2a = torch.cat([stacked_each[r][rank * 2: rank * 2 + 2] for r in range(size)])
    root = size - 1
    nxt, prv = (rank + 1) % size, (rank - 1) % size

    def p2p(name: str) -> Any:
        sent = F.isend(x.clone(), nxt, 0, name)
        got = F.irecv(torch.empty(4, 3), prv, 0, name)
        wait(sent)
        return wait(got), each[prv]

    def batch(name: str) -> Any:
        got = wait(F.batch_p2p_ops(["isend", "irecv"], [nxt, prv], [0, 0], [x.clone(), torch.empty(4, 3)], name))
        return got[1], each[prv]

    def autograd(call: Callable[[Any, Any], Any], leaf_value: Any, want: Any, grad: float) -> Callable[[str], Any]:
        """torch's autograd wrapper of the op (what a user calls): its value, and the gradient
        of twice the sum of it, which runs the op's backward collective."""

        def run(name: str) -> Any:
            leaf = leaf_value.clone().requires_grad_(True)
            out = fc.wait_tensor(call(leaf, dist.distributed_c10d._resolve_process_group(name)))
            (2 * out).sum().backward()
            return torch.cat([out.detach().flatten(), leaf.grad.flatten()]), torch.cat(
                [want.flatten(), torch.full((leaf.numel(),), grad)]
            )

        return run

    return {
        "all_reduce": lambda n: (wait(F.all_reduce(x.clone(), "sum", n)), total),
        "all_reduce_": lambda n: (wait(F.all_reduce_(x.clone(), "sum", n)), total),
        "all_reduce_coalesced": lambda n: (
            torch.cat(wait(F.all_reduce_coalesced([x.clone(), 2 * x], "max", n))),
            torch.cat([torch.stack(each).amax(0), 2 * torch.stack(each).amax(0)]),
        ),
        "all_reduce_coalesced_": lambda n: (
            torch.cat(wait(F.all_reduce_coalesced_([x.clone(), 2 * x], "sum", n))), torch.cat([total, 2 * total])
        ),
        "all_gather_into_tensor": lambda n: (wait(F.all_gather_into_tensor(x, size, n)), gathered),
        "all_gather_into_tensor_out": lambda n: (
            torch.cat([
                wait(F.all_gather_into_tensor_out(x, size, n, out=torch.empty(size * 4, 3))),
                wait(F.all_gather_into_tensor_out(transposed, size, n, out=torch.empty(size * 4, 3))),
            ]),
            torch.cat([gathered, gathered_t]),
        ),
        "all_gather_into_tensor_coalesced": lambda n: (
            torch.cat(wait(F.all_gather_into_tensor_coalesced([x, 3 * x], size, n))),
            torch.cat([gathered, 3 * gathered]),
        ),
        "reduce_scatter_tensor": lambda n: (wait(F.reduce_scatter_tensor(stacked_in, "sum", size, n)), scattered),
        "reduce_scatter_tensor_out": lambda n: (
            wait(F.reduce_scatter_tensor_out(stacked_in, "sum", size, n, out=torch.empty(2, 3))), scattered
        ),
        "reduce_scatter_tensor_coalesced": lambda n: (
            torch.cat(wait(F.reduce_scatter_tensor_coalesced([stacked_in, 2 * stacked_in], "sum", size, n))),
            torch.cat([scattered, 2 * scattered]),
        ),
        "all_to_all_single": lambda n: (wait(F.all_to_all_single(stacked_in, [2] * size, [2] * size, n)), a2a),
        "broadcast": lambda n: (wait(F.broadcast(x.clone(), root, n)), each[root]),
        "broadcast_": lambda n: (wait(F.broadcast_(x.clone(), root, n)), each[root]),
        "isend": p2p,
        "irecv": p2p,
        "batch_p2p_ops": batch,
        "wait_tensor": lambda n: (wait(F.all_reduce(x.clone(), "sum", n)), total),
        # the gradient of a gather is a reduce-scatter (of 2s from every rank), of a
        # reduce-scatter a gather, of an all-to-all an all-to-all
        "autograd::all_gather_into_tensor": autograd(
            lambda t, g: fc.all_gather_tensor_autograd(t, 0, g), x, gathered, 2.0 * size
        ),
        "autograd::reduce_scatter_tensor": autograd(
            lambda t, g: fc.reduce_scatter_tensor_autograd(t, "sum", 0, g), stacked_in, scattered, 2.0
        ),
        "autograd::all_to_all_single": autograd(
            lambda t, g: fc.all_to_all_single_autograd(t, None, None, g), stacked_in, a2a, 2.0
        ),
    }


def functional(check: Checker, groups: Dict[str, Any], rank: int, size: int) -> None:
    cases = functional_cases(rank, size)
    every = {
        name.split("::")[1] if name.startswith("_c10d_functional::") else "autograd::" + name.split("::")[1]
        for name in torch._C._dispatch_get_all_op_names()
        if name.startswith(("_c10d_functional::", "_c10d_functional_autograd::")) and "::_" not in name
    }
    check.check(every <= set(cases), f"_c10d_functional ops this program does not call: {sorted(every - set(cases))}")
    for op, call in cases.items():
        answers = {}
        for backend, group in groups.items():
            try:
                got, want = call(group.group_name)
            except Exception as error:  # noqa: BLE001 - each backend's failure is a finding
                answers[backend] = None
                if backend == "denseccl":
                    check.fail(f"functional {op} on denseccl: {type(error).__name__}: {error}")
                continue
            answers[backend] = got
            check.equal(f"functional {op} on {backend}", got, want)
        if answers.get("gloo") is not None and answers.get("denseccl") is not None:
            check.equal(f"functional {op}: denseccl against gloo", answers["denseccl"], answers["gloo"])


def compiled(check: Checker, groups: Dict[str, Any], rank: int, size: int) -> None:
    """The out-variant inside torch.compile: traced with fake (meta) tensors, which must take
    torch's meta kernel, then run on the group."""
    x = values(6, rank, (4, 3), torch.float32)
    want = torch.cat([2 * values(6, r, (4, 3), torch.float32) for r in range(size)]) + 1
    for backend, group in groups.items():
        name = group.group_name

        def gather(t: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
            return F.wait_tensor(F.all_gather_into_tensor_out(t * 2, size, name, out=out)) + 1

        try:
            got = torch.compile(gather, backend="aot_eager", fullgraph=True)(x, torch.empty(size * 4, 3))
        except Exception as error:  # noqa: BLE001
            check.fail(f"compiled all_gather_into_tensor_out on {backend}: {type(error).__name__}: {error}")
            continue
        check.equal(f"compiled all_gather_into_tensor_out on {backend}", got, want)


def devices(check: Checker, groups: Dict[str, Any]) -> None:
    dense, gloo = groups["denseccl"], groups["gloo"]
    kinds = {d.type for d in dense._device_types}
    check.check(kinds == {"cpu", "cuda"}, f"denseccl group's device types: {kinds}")
    check.check(kinds == {d.type for d in gloo._device_types}, f"device types differ from gloo's: {kinds}")
    for kind in ("cpu", "cuda"):
        try:
            backend = dense._get_backend(torch.device(kind))
            check.check(not backend.supports_splitting and not backend.supports_tensor_alloc(torch.device(kind)),
                        f"backend for {kind} claims splitting or an allocator")
        except Exception as error:  # noqa: BLE001
            check.fail(f"_get_backend({kind}): {type(error).__name__}: {error}")
    from torch.distributed.distributed_c10d import _get_object_coll_device

    check.check(_get_object_coll_device(dense) == _get_object_coll_device(gloo) == "cpu", "object collectives' device")


def sequence(check: Checker, groups: Dict[str, Any], rank: int, size: int) -> None:
    """Each plain call takes one number, as on gloo; the ranks agree; the number is the flight
    recorder's sequence of that call."""
    dense, gloo = groups["denseccl"], groups["gloo"]
    x = torch.ones(5)
    calls: Dict[str, Callable[[Any], Any]] = {
        "allreduce": lambda g: dist.all_reduce(x, group=g),
        "broadcast": lambda g: dist.broadcast(x, 0, group=g),
        "reduce": lambda g: dist.reduce(x, 0, group=g),
        "allgather": lambda g: dist.all_gather_into_tensor(torch.empty(size * 5), x, group=g),
        "reduce_scatter": lambda g: dist.reduce_scatter_tensor(torch.empty(5), torch.ones(size * 5), group=g),
        "allreduce (async)": lambda g: dist.all_reduce(x, group=g, async_op=True).wait(),
    }
    try:
        first = dense._get_sequence_number_for_group()
    except Exception as error:  # noqa: BLE001
        check.fail(f"_get_sequence_number_for_group: {type(error).__name__}: {error}")
        return
    dense._set_sequence_number_for_group()  # what torch calls on gloo and nccl groups when it makes them
    check.check(dense._get_sequence_number_for_group() == first, "_set_sequence_number_for_group changed the number")
    recorder = dense.host_communicator.flow.recorder
    for name, call in calls.items():
        before, gloo_before = dense._get_sequence_number_for_group(), gloo._get_sequence_number_for_group()
        call(dense)
        call(gloo)
        after, gloo_after = dense._get_sequence_number_for_group(), gloo._get_sequence_number_for_group()
        check.check(after - before == gloo_after - gloo_before == 1,
                    f"{name}: sequence {before} -> {after} (gloo {gloo_before} -> {gloo_after})")
        last = recorder.entries()[-1]
        check.check(last["seq"] == before and name.split()[0] in last["collective"],
                    f"{name}: the flight recorder numbered it {last['seq']} ({last['collective']}), the group {before}")
    numbers: List[Any] = [None] * size
    dist.all_gather_object(numbers, dense._get_sequence_number_for_group(), group=gloo)
    check.check(len(set(numbers)) == 1 and numbers[0] >= len(calls), f"ranks' sequence numbers differ: {numbers}")


def profiled(check: Checker, groups: Dict[str, Any]) -> None:
    """A range per call, with the input's shape and dtype, the agreement step inside it."""
    x = torch.ones(6, 7, dtype=torch.float64)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        dist.all_reduce(x, group=groups["denseccl"])
        dist.all_gather_into_tensor(torch.empty(dist.get_world_size() * 6, 7, dtype=torch.float64), x,
                                    group=groups["denseccl"])
        dist.all_reduce(x, group=groups["gloo"])
    events = list(prof.events())
    for backend, collective in (("denseccl", "all_reduce"), ("denseccl", "all_gather"), ("gloo", "all_reduce")):
        name = f"{backend}:{collective}"
        found = [e for e in events if e.name == name and [6, 7] in e.input_shapes]
        names = sorted({e.name for e in events})
        if not check.check(found, f"no profiler range {name} with the input's shape: {names}"):
            continue
        check.check(any("double" in str(t).lower() for t in found[0].input_dtypes),
                    f"{name}: the input's dtype is missing ({found[0].input_dtypes})")
    calls = [e for e in events if e.name.startswith("denseccl:") and e.name != "denseccl:agreement"]
    agreements = [e for e in events if e.name == "denseccl:agreement"]
    if dist.get_world_size() > 1:
        check.check(len(agreements) == len(calls) == 2, f"{len(agreements)} agreement ranges for {len(calls)} calls")
    for agreement in agreements:
        inside = [c for c in calls if c.time_range.start <= agreement.time_range.start
                  and agreement.time_range.end <= c.time_range.end]
        check.check(inside, "an agreement range outside every denseccl call's range")


def main() -> None:
    init()
    rank, size = dist.get_rank(), dist.get_world_size()
    check = Checker("torch-tooling", rank, size)
    groups = {"denseccl": dist.group.WORLD, "gloo": dist.new_group(backend="gloo")}
    functional(check, groups, rank, size)
    compiled(check, groups, rank, size)
    devices(check, groups)
    sequence(check, groups, rank, size)
    profiled(check, groups)
    dist.barrier(group=groups["gloo"])
    check.done()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
