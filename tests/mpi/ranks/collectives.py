"""Rank program: run a batch of collective cases (a JSON list) and check every result against
an independent NumPy reference built from all ranks' inputs.

usage: mpiexec -n N python collectives.py CASES.json
"""

from __future__ import annotations

import sys
import traceback
from typing import Any, Dict

import numpy as np

from tests.mpi.ranks.common import (
    as_denseccl_op,
    build,
    compare,
    describe,
    element_strides,
    empty_strided,
    load_cases,
    raw_bytes,
    same_values,
    sentinel_like,
    strides_for,
    to_numpy,
    values,
    wait_for,
)
from tests.support.checker import Checker
from tests.support.layouts import assign


def call(comm: Any, case: Dict[str, Any], method: str, *args: Any, **kwargs: Any) -> Any:
    if case.get("async"):
        work = getattr(comm, method)(*args, async_op=True, **kwargs)
        assert type(work).__name__ == "Work", f"async_op=True returned {type(work).__name__}"
        return wait_for(work)
    return getattr(comm, method)(*args, **kwargs)


def run_case(comm: Any, case: Dict[str, Any], check: Checker) -> None:
    rank, size = comm.rank, comm.size
    case = dict(case, size=size)
    what = describe(case)
    shape = tuple(case["shape"])
    strides = strides_for(case)
    out_strides = strides_for(case, case["out_odd"])
    dtype, collective, mode = case["dtype"], case["collective"], case["mode"]
    numel = int(np.prod(shape, dtype=np.int64))

    if collective == "barrier":
        check.check(comm.barrier() is None, f"{what}: barrier returned something")
        return

    if collective == "reduce_scatter":
        block_values = [values(case, r, (size, *shape)) for r in range(size)]
        stacked_strides = (numel, *strides)
        x = build(case, block_values[rank], stacked_strides)
    else:
        all_values = [values(case, r, shape) for r in range(size)]
        x = build(case, all_values[rank], strides)

    op = as_denseccl_op(case["op"]) if case.get("op") is not None else None
    before = raw_bytes(x)

    if collective == "allreduce":
        inputs = [to_numpy(build(case, v, strides)) for v in all_values]
        if mode == "out":
            out = sentinel_like(case, shape, out_strides)
            result = call(comm, case, "allreduce", x, op, out=out)
            check.check(result is out, f"{what}: allreduce(out=) did not return out")
            check.check(raw_bytes(x) == before, f"{what}: input written although out= was given")
        else:
            result = call(comm, case, "allreduce", x, op)
            check.check(result is x, f"{what}: in-place allreduce did not return x")
        compare(check, f"{what} allreduce", to_numpy(result), inputs, dtype, case["op"], size)

    elif collective == "reduce":
        root = case["root"] % size
        inputs = [to_numpy(build(case, v, strides)) for v in all_values]
        out = sentinel_like(case, shape, out_strides) if mode == "out" else None
        out_before = raw_bytes(out) if out is not None else None
        result = call(comm, case, "reduce", x, root, op, out=out)
        if rank == root:
            expected_result = out if out is not None else x
            check.check(result is expected_result, f"{what}: reduce on root returned the wrong array")
            if out is not None:
                check.check(raw_bytes(x) == before, f"{what}: root input written although out= was given")
            compare(check, f"{what} reduce(root={root})", to_numpy(result), inputs, dtype, case["op"], size)
        else:
            check.check(result is x, f"{what}: reduce on a non-root did not return x")
            check.check(raw_bytes(x) == before, f"{what}: non-root input was written")
            if out is not None:
                check.check(raw_bytes(out) == out_before, f"{what}: non-root out was written (must be ignored)")

    elif collective == "broadcast":
        root = case["root"] % size
        expected = to_numpy(build(case, all_values[root], strides))
        result = call(comm, case, "broadcast", x, root)
        check.check(result is x, f"{what}: broadcast did not return x")
        check.check(same_values(to_numpy(x), expected), f"{what}: broadcast(root={root}) gave the wrong values")
        check.check(element_strides(x) == strides, f"{what}: broadcast changed the strides")

    elif collective == "allgather":
        inputs = [to_numpy(build(case, v, strides)) for v in all_values]
        stacked_out_strides = (numel, *out_strides)
        if mode == "new":
            result = call(comm, case, "allgather", x)
            check.check(
                element_strides(result) == (numel, *strides),
                f"{what}: allgather result strides {element_strides(result)}, expected {(numel, *strides)}",
            )
            check.check(raw_bytes(x) == before, f"{what}: allgather wrote its input")
        else:
            out = empty_strided((size, *shape), stacked_out_strides, dtype, case["lib"])
            assign(out, to_numpy(sentinel_like(case, (size, *shape), stacked_out_strides)))
            if mode == "own_block":
                x = out[rank, ...]  # a view (out[rank] of a 1-d NumPy array is a scalar)
                assign(x, all_values[rank])
                result = call(comm, case, "allgather", x, out=out)
            else:
                result = call(comm, case, "allgather", x, out=out)
                check.check(raw_bytes(x) == before, f"{what}: allgather wrote its input")
            check.check(result is out, f"{what}: allgather(out=) did not return out")
        gathered = to_numpy(result)
        check.check(gathered.shape == (size, *shape), f"{what}: allgather shape {gathered.shape}")
        for r in range(size):
            if gathered.shape == (size, *shape) and not same_values(gathered[r], inputs[r]):
                check.fail(f"{what}: allgather block {r} is not rank {r}'s input")

    elif collective == "reduce_scatter":
        inputs = [to_numpy(build(case, v, (numel, *strides)))[rank] for v in block_values]
        if mode == "out":
            out = sentinel_like(case, shape, out_strides)
            result = call(comm, case, "reduce_scatter", x, op, out=out)
            check.check(result is out, f"{what}: reduce_scatter(out=) did not return out")
        else:
            result = call(comm, case, "reduce_scatter", x, op)
            check.check(
                element_strides(result) == strides,
                f"{what}: reduce_scatter result strides {element_strides(result)}, expected {strides}",
            )
        check.check(raw_bytes(x) == before, f"{what}: reduce_scatter wrote its input")
        compare(check, f"{what} reduce_scatter", to_numpy(result), inputs, dtype, case["op"], size)
    else:
        check.fail(f"unknown collective {collective}")


def main() -> None:
    cases = load_cases(sys.argv[1])
    if any(case["lib"] == "torch" for case in cases):
        import torch  # noqa: F401  (so that torch tensors are recognised)
    import denseccl

    comm = denseccl.init(backend="mpi")
    check = Checker("collectives", comm.rank, comm.size)
    for case in cases:
        try:
            run_case(comm, case, check)
        except Exception:  # noqa: BLE001 - report and go on; every rank runs every case
            check.fail(f"{describe(case)}: raised\n{traceback.format_exc()}")
            if comm.broken:
                break
    # the communicator is still healthy after the whole batch
    probe = np.full(3, comm.rank + 1, np.int64)
    check.check(comm.allreduce(probe).tolist() == [comm.size * (comm.size + 1) // 2] * 3, "final probe allreduce")
    check.check(comm.broken is None, f"communicator broken: {comm.broken}")
    check.finish()


if __name__ == "__main__":
    main()
