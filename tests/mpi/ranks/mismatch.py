"""Rank program: the mismatch matrix on ONE communicator.

For each scenario some ranks (the deviants) call with another layout, shape, dtype, op, root or
collective, or with an invalid input. Every rank must raise (MismatchError, or the local error
on a rank whose own input is invalid), no buffer may change, and the same communicator must then
run a correct collective. Scenarios where ranks *should* agree (size-1 strides, empty arrays,
0-d arrays, a non-root's ignored out) must succeed with the right result.

usage: mpiexec -n N python mismatch.py [--torch]
"""

from __future__ import annotations

import sys
import traceback
from typing import Callable, List, Optional, Sequence

import numpy as np

import denseccl
from tests.support.checker import Checker
from tests.support.layouts import empty_strided, raw_bytes, to_numpy


def ranks_text(ranks: Sequence[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(str(r) for r in ranks)


def c_array(shape, rank, dtype="float32"):
    return (np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape) + 100 * rank).astype(dtype)


def f_array(shape, rank, dtype="float32"):
    return np.asfortranarray(c_array(shape, rank, dtype))


class Scenario:
    """``call(comm, rank, deviant) -> (thunk, arrays)``; ``expect(rank, deviant)`` is the
    exception type that rank must raise; ``fragments`` must appear in every MismatchError."""

    def __init__(self, name: str, call: Callable, *, field: Optional[str] = None, normal: Optional[str] = None,
                 odd: Optional[str] = None, invalid: Optional[str] = None, local: type = denseccl.LayoutError) -> None:
        self.name, self.call, self.field = name, call, field
        self.normal, self.odd = normal, odd  # descriptor texts of the two groups
        self.invalid = invalid  # fragment of the invalid rank's error, when a deviant's input is invalid
        self.local = local


def deviant_sets(size: int) -> List[List[int]]:
    sets = [[size - 1]]
    if size >= 3:
        sets.append([0, size - 1])  # several, including the lowest rank
    return sets


def scenarios(size: int) -> List[Scenario]:
    def allreduce_of(make, op="sum"):
        def call(comm, rank, deviant):
            x = make(rank, deviant)
            return (lambda: comm.allreduce(x, op)), [x]
        return call

    out: List[Scenario] = [
        Scenario("layout C vs transposed", allreduce_of(lambda r, d: f_array((3, 4), r) if d else c_array((3, 4), r)),
                 field="layout", normal="allreduce op=sum float32 shape (3, 4) strides (4, 1)",
                 odd="allreduce op=sum float32 shape (3, 4) strides (1, 3)"),
        Scenario("layout flipped", allreduce_of(lambda r, d: c_array((3, 4), r)[::-1] if d else c_array((3, 4), r)),
                 field="layout", odd="allreduce op=sum float32 shape (3, 4) strides (-4, 1)"),
        Scenario("layout channels-last", allreduce_of(
            lambda r, d: c_array((2, 4, 5, 3), r).transpose(0, 3, 1, 2) if d else c_array((2, 3, 4, 5), r)),
            field="layout", odd="strides (60, 1, 15, 3)", normal="strides (60, 20, 5, 1)"),
        Scenario("shape", allreduce_of(lambda r, d: c_array((4, 3), r) if d else c_array((3, 4), r)),
                 field="shape", odd="allreduce op=sum float32 shape (4, 3) strides (3, 1)"),
        Scenario("shape flat", allreduce_of(lambda r, d: c_array((12,), r) if d else c_array((3, 4), r)),
                 field="shape", odd="shape (12,) strides (1,)"),
        Scenario("dtype", allreduce_of(lambda r, d: c_array((3, 4), r, "float64") if d else c_array((3, 4), r)),
                 field="dtype", odd="allreduce op=sum float64 shape (3, 4) strides (4, 1)"),
        Scenario("op", lambda comm, r, d: _call(comm.allreduce, c_array((5,), r), "max" if d else "sum"),
                 field="op", odd="allreduce op=max", normal="allreduce op=sum"),
        Scenario("op premul factor",
                 lambda comm, r, d: _call(comm.allreduce, c_array((5,), r), denseccl.PreMulSum(0.25 if d else 0.5)),
                 field="op", odd="op=premul_sum(0.25)", normal="op=premul_sum(0.5)"),
        Scenario("root reduce", lambda comm, r, d: _call(comm.reduce, c_array((5,), r), 1 if d else 0),
                 field="root", odd="reduce root=1 op=sum", normal="reduce root=0 op=sum"),
        Scenario("root broadcast", lambda comm, r, d: _call(comm.broadcast, c_array((2, 2), r), 1 if d else 0),
                 field="root", odd="broadcast root=1 float32", normal="broadcast root=0 float32"),
        Scenario("collective allreduce vs broadcast",
                 lambda comm, r, d: (
                     _call(comm.broadcast, c_array((3,), r), 0) if d else _call(comm.allreduce, c_array((3,), r))
                 ),
                 field="collective", odd="broadcast root=0 float32 shape (3,)",
                 normal="allreduce op=sum float32 shape (3,)"),
        Scenario("collective allreduce vs barrier",
                 lambda comm, r, d: ((lambda: comm.barrier()), []) if d else _call(comm.allreduce, c_array((3,), r)),
                 field="collective", normal="allreduce op=sum"),
        Scenario("collective allgather vs reduce_scatter",
                 lambda comm, r, d: (
                     _call(comm.reduce_scatter, c_array((comm.size, 2), r)) if d
                     else _call(comm.allgather, c_array((2,), r))
                 ),
                 field="collective", odd="reduce_scatter op=sum float32 shape (2,) strides (1,)",
                 normal="allgather float32 shape (2,) strides (1,)"),
        Scenario("allgather block layout",
                 lambda comm, r, d: _call(comm.allgather, f_array((2, 3), r) if d else c_array((2, 3), r)),
                 field="layout", odd="allgather float32 shape (2, 3) strides (1, 2)"),
        # bad input on the deviants: LayoutError there, MismatchError elsewhere
        Scenario("invalid gapped input",
                 allreduce_of(lambda r, d: c_array((4, 6), r)[:, ::2] if d else c_array((4, 3), r)),
                 invalid="shape (4, 3) strides (6, 2)"),
        Scenario("invalid expanded input", allreduce_of(
            lambda r, d: np.lib.stride_tricks.as_strided(c_array((3,), r), (4, 3), (0, 4)) if d
            else c_array((4, 3), r)),
            invalid="strides (0, 1)"),
        Scenario("invalid out layout",
                 lambda comm, r, d: _call(
                     comm.allreduce, c_array((3, 4), r), out=f_array((3, 4), 9) if d else c_array((3, 4), 9)
                 ),
                 invalid="out has float32 shape (3, 4) strides (1, 3)"),
        Scenario("invalid read-only input",
                 allreduce_of(lambda r, d: _readonly(c_array((3,), r)) if d else c_array((3,), r)),
                 invalid="read-only"),
        Scenario("invalid root", lambda comm, r, d: _call(comm.reduce, c_array((3,), r), comm.size if d else 0),
                 invalid=f"root {size} is not a rank", local=denseccl.ArgumentError),
        Scenario("invalid op", lambda comm, r, d: _call(comm.allreduce, c_array((3,), r), "bogus" if d else "sum"),
                 invalid="unknown reduction op 'bogus'", local=denseccl.OpError),
        Scenario("invalid op for dtype",
                 lambda comm, r, d: _call(comm.allreduce, c_array((3,), r, "complex64"), "min" if d else "sum"),
                 invalid="op min is not defined for dtype complex64", local=denseccl.OpError),
        Scenario("invalid not an array",
                 lambda comm, r, d: _call(comm.allreduce, [1.0, 2.0] if d else c_array((2,), r)),
                 invalid="expected an array"),
        Scenario("invalid allgather out",
                 lambda comm, r, d: _call(
                     comm.allgather, c_array((2,), r), out=np.zeros((comm.size + (1 if d else 0), 2), np.float32)
                 ),
                 invalid="not a stacked buffer"),
        Scenario("invalid allgather from another rank's block", _allgather_from_block,
                 invalid="the input may only be out's own block"),
        Scenario("invalid reduce_scatter input",
                 lambda comm, r, d: _call(comm.reduce_scatter, c_array((comm.size + (1 if d else 0), 2), r)),
                 invalid="is not a stacked buffer"),
        Scenario("invalid byte order", allreduce_of(lambda r, d: c_array((3,), r, ">f4") if d else c_array((3,), r)),
                 invalid="byte order"),
        # the output cannot be allocated on the deviants (out of memory): they still join the agreement
        Scenario("allgather output allocation fails", _failing_allocation("allgather"),
                 invalid="simulated: no memory for the output", local=MemoryError),
        Scenario("reduce_scatter output allocation fails", _failing_allocation("reduce_scatter"),
                 invalid="simulated: no memory for the output", local=MemoryError),
    ]
    return out


def _failing_allocation(collective: str) -> Callable:
    """Deviants run out of memory when denseccl allocates the result (the allocator is replaced
    for that one call; MPI is real)."""
    def call(comm, rank, deviant):
        x = c_array((comm.size, 2), rank) if collective == "reduce_scatter" else c_array((2,), rank)

        def thunk():
            if not deviant:
                return getattr(comm, collective)(x)
            import denseccl.communicator as module

            def refuse(*args, **kwargs):
                raise MemoryError("simulated: no memory for the output")

            real, module.allocate = module.allocate, refuse
            try:
                return getattr(comm, collective)(x)
            finally:
                module.allocate = real
        return thunk, [x]
    return call


def _allgather_from_block(comm, rank, deviant):
    out = np.zeros((comm.size, 2, 2), np.float32)
    block = (rank + 1) % comm.size if deviant else rank  # deviants pass a peer's block as x
    out[block] = c_array((2, 2), rank)
    return _call(comm.allgather, out[block], out=out)


def _readonly(x):
    x.flags.writeable = False
    return x


def _call(method, *args, **kwargs):
    arrays = [
        a
        for a in list(args) + list(kwargs.values())
        if isinstance(a, np.ndarray) or type(a).__module__.startswith("torch")
    ]
    return (lambda: method(*args, **kwargs)), arrays


def probe(comm, check: Checker, what: str) -> None:
    """The same communicator still runs a correct collective."""
    x = np.full((2, 3), comm.rank + 1, np.int64).T
    try:
        comm.allreduce(x)
        check.check(
            x.tolist() == [[comm.size * (comm.size + 1) // 2] * 2] * 3, f"{what}: probe allreduce gave {x.tolist()}"
        )
    except Exception as error:  # noqa: BLE001
        check.fail(f"{what}: probe allreduce raised {type(error).__name__}: {error}")
    check.check(comm.broken is None, f"{what}: communicator broken: {comm.broken}")


def run_mismatch(comm, check: Checker, scenario: Scenario, deviants: List[int]) -> None:
    rank, size = comm.rank, comm.size
    what = f"{scenario.name} (deviants {deviants})"
    deviant = rank in deviants
    thunk, arrays = scenario.call(comm, rank, deviant)
    before = [raw_bytes(a) for a in arrays]
    expected = scenario.local if (deviant and scenario.invalid) else denseccl.MismatchError
    try:
        thunk()
        check.fail(f"{what}: no error raised (expected {expected.__name__})")
    except expected as error:
        text = str(error)
        if expected is denseccl.MismatchError:
            others = [r for r in range(size) if r not in deviants]
            check.check("mismatch" in text, f"{what}: 'mismatch' not in {text!r}")
            check.check(f"seen by rank {rank}" in text, f"{what}: message does not say who saw it: {text!r}")
            if scenario.invalid:
                check.check("a peer's input failed validation" in text, f"{what}: headline: {text!r}")
                for d in deviants:
                    check.check(
                        f"rank {d}: " in text and "invalid input" in text and scenario.invalid in text,
                        f"{what}: invalid rank {d} not reported: {text!r}",
                    )
                check.check(f"{ranks_text(others)}: " in text, f"{what}: good ranks {others} not listed: {text!r}")
            else:
                headline = text.split("\n")[0]
                check.check(
                    "ranks disagree on" in headline and scenario.field in headline,
                    f"{what}: field {scenario.field!r} not named: {headline!r}",
                )
                lines = text.split("\n")
                check.check(
                    any(
                        line.strip().startswith(f"{ranks_text(deviants)}: ") and (scenario.odd or "") in line
                        for line in lines
                    ),
                    f"{what}: deviants' descriptor not listed: {text!r}",
                )
                check.check(
                    any(
                        line.strip().startswith(f"{ranks_text(others)}: ") and (scenario.normal or "") in line
                        for line in lines
                    ),
                    f"{what}: other ranks' descriptor not listed: {text!r}",
                )
        else:
            check.check(scenario.invalid in text, f"{what}: local error {text!r} lacks {scenario.invalid!r}")
    except Exception as error:  # noqa: BLE001
        check.fail(
            f"{what}: raised {type(error).__name__} instead of {expected.__name__}: {error}\n{traceback.format_exc()}"
        )
    for array, snapshot in zip(arrays, before):
        check.check(raw_bytes(array) == snapshot, f"{what}: a buffer was written")
    probe(comm, check, what)


# -- scenarios where the ranks agree ------------------------------------------------------------


def run_agreeing(comm, check: Checker, use_torch: bool) -> None:
    rank, size = comm.rank, comm.size

    # size-1 dims with different odd strides on every rank: same key, so they agree
    odd = [(3, 4 + 3 * rank, 1), (3, -rank - 2, 1), (3, 0, 1)][rank % 3]
    x = empty_strided((4, 1, 3), odd, "float32")
    x[...] = c_array((4, 1, 3), rank)
    try:
        comm.allreduce(x)
        expected = sum(c_array((4, 1, 3), r).astype(np.float64) for r in range(size))
        check.check(np.array_equal(x, expected), "size-1 strides: wrong sum")
        gathered = comm.allgather(x)
        check.check(all(np.array_equal(gathered[r], x) for r in range(size)), "size-1 strides: allgather")
    except Exception as error:  # noqa: BLE001
        check.fail(f"size-1 strides: raised {type(error).__name__}: {error}")

    # a [Cout, Cin, 1, 1] weight: strides (Cin, 1, Cin, Cin) on some ranks, (Cin, 1, 1, 1) on others
    w = empty_strided((6, 5, 1, 1), (5, 1, 5, 5) if rank % 2 else (5, 1, 1, 1), "float64")
    w[...] = rank
    try:
        comm.allreduce(w, "max")
        check.check(bool(np.all(w == size - 1)), "conv weight: wrong max")
    except Exception as error:  # noqa: BLE001
        check.fail(f"conv weight: raised {type(error).__name__}: {error}")

    # empty arrays with different strides agree and move nothing
    e = np.zeros((0, 3), np.float32) if rank % 2 else np.zeros((3, 0), np.float32).T
    try:
        check.check(comm.allreduce(e) is e, "empty: allreduce result")
        g = comm.allgather(e)
        check.check(g.shape == (size, 0, 3), f"empty: allgather shape {g.shape}")
        s = comm.reduce_scatter(np.zeros((size, 0, 3), np.float32))
        check.check(s.shape == (0, 3), f"empty: reduce_scatter shape {s.shape}")
        comm.broadcast(e, size - 1)
    except Exception as error:  # noqa: BLE001
        check.fail(f"empty: raised {type(error).__name__}: {error}")

    # 0-d arrays
    z = np.array(float(rank + 1))
    try:
        check.check(
            comm.allreduce(z, "prod") is z and float(z) == float(np.prod(np.arange(1, size + 1))), f"0-d allreduce: {z}"
        )
        z2 = np.array(rank, np.int16)
        comm.broadcast(z2, size - 1)
        check.check(int(z2) == size - 1, "0-d broadcast")
        g = comm.allgather(np.array(rank, np.int32))
        check.check(g.shape == (size,) and g.tolist() == list(range(size)), f"0-d allgather {g}")
        s = comm.reduce_scatter(np.arange(size, dtype=np.int32) * (rank + 1))
        check.check(s.shape == () and int(s) == rank * size * (size + 1) // 2, f"0-d reduce_scatter {s}")
    except Exception as error:  # noqa: BLE001
        check.fail(f"0-d: raised {type(error).__name__}: {error}")

    # reduce: a non-root's out is ignored, even a wrong one
    root = size - 1
    y = c_array((3, 4), rank)
    wrong = f_array((2, 2), 0, "int8")
    wrong_before = raw_bytes(wrong)
    try:
        result = comm.reduce(y, root, out=None if rank == root else wrong)
        if rank == root:
            check.check(
                np.array_equal(result, sum(c_array((3, 4), r).astype(np.float64) for r in range(size))),
                "reduce root result",
            )
        else:
            check.check(result is y and np.array_equal(y, c_array((3, 4), rank)), "non-root input changed")
            check.check(raw_bytes(wrong) == wrong_before, "non-root out was written")
    except Exception as error:  # noqa: BLE001
        check.fail(f"reduce with ignored out: raised {type(error).__name__}: {error}")

    if use_torch:
        import torch

        # NumPy on some ranks, torch on others: same dtype, shape and strides -> one layout key
        if rank % 2:
            t = torch.arange(12, dtype=torch.float32).reshape(4, 3).t() + 100 * rank
        else:
            t = np.asfortranarray(c_array((4, 3), rank).T)  # (3, 4) with strides (1, 3)
        try:
            comm.allreduce(t)
            expected = sum(c_array((4, 3), r).T.astype(np.float64) for r in range(size))
            check.check(np.array_equal(to_numpy(t), expected), "numpy + torch: wrong sum")
        except Exception as error:  # noqa: BLE001
            check.fail(f"numpy + torch: raised {type(error).__name__}: {error}")
        # and torch transposed vs torch contiguous must mismatch
        u = torch.zeros(3, 4) if rank == 0 else torch.zeros(4, 3).t()
        try:
            comm.allreduce(u)
            check.fail("torch layout mismatch: no error")
        except denseccl.MismatchError as error:
            check.check("layout" in str(error).split("\n")[0], f"torch layout mismatch: {error}")
        check.check(bool((u == 0).all()), "torch layout mismatch: buffer written")
        probe(comm, check, "torch")


def main() -> None:
    use_torch = "--torch" in sys.argv[1:]
    if use_torch:
        import torch  # noqa: F401
    from mpi4py import MPI

    # line the ranks up first: init's own deadline is the (short) timeout under test, and ranks
    # that start seconds apart on a loaded machine would time out there instead
    MPI.COMM_WORLD.Barrier()
    comm = denseccl.init(backend="mpi")
    check = Checker("mismatch", comm.rank, comm.size)
    for scenario in scenarios(comm.size):
        for deviants in deviant_sets(comm.size):
            run_mismatch(comm, check, scenario, deviants)
            if comm.broken:
                break
    run_agreeing(comm, check, use_torch)
    probe(comm, check, "at the end")
    check.finish()


if __name__ == "__main__":
    main()
