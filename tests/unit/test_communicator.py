"""The Communicator on one rank (an MPI singleton, no mpiexec): results, and every local
validation error — its message names the layout and the fix, nothing is touched, and the
communicator stays usable."""

from __future__ import annotations

import numpy as np
import pytest

import denseccl
from denseccl import LayoutError
from tests.support.layouts import element_strides, filled, make_strides, raw_bytes
from tests.support.optional import needs_mpi4py, needs_torch, require_mpi4py, torch


@pytest.fixture(scope="module")
def comm():
    require_mpi4py()
    communicator = denseccl.init(backend="mpi", timeout=30)
    yield communicator
    communicator.close()


@needs_mpi4py
def test_singleton_without_mpiexec():
    communicator = denseccl.init()
    try:
        assert (communicator.rank, communicator.size, communicator.backend) == (0, 1, "mpi")
        assert communicator.check is True
    finally:
        communicator.close()


# -- results on one rank --------------------------------------------------------------------

LAYOUTS = [
    ((3, 4), (0, 1), ()),
    ((3, 4), (1, 0), ()),
    ((2, 3, 4), (2, 0, 1), (1,)),
    ((4, 1, 5), (2, 1, 0), (0, 2)),
    ((), (), ()),
    ((0, 3), (1, 0), (1,)),
]


@pytest.mark.parametrize("shape, order, flips", LAYOUTS)
def test_one_rank_collectives(comm, shape, order, flips):
    strides = make_strides(shape, order, flips, [7] * len(shape))
    values = np.arange(np.prod(shape, dtype=int), dtype=np.float64).reshape(shape) - 2.5
    x = filled(values, strides, "float64")
    assert comm.allreduce(x, "sum") is x and np.array_equal(x, values)
    assert comm.allreduce(x, denseccl.PreMulSum(2.0)) is x and np.array_equal(x, 2 * values)
    assert comm.allreduce(x, "avg") is x and np.array_equal(x, 2 * values)
    out = filled(np.zeros(shape), strides, "float64")
    assert comm.allreduce(x, "max", out=out) is out and np.array_equal(out, 2 * values)
    assert comm.reduce(x, 0, "prod") is x and np.array_equal(x, 2 * values)
    assert comm.broadcast(x, 0) is x and np.array_equal(x, 2 * values)
    gathered = comm.allgather(x)
    assert gathered.shape == (1, *shape) and np.array_equal(gathered[0], x)
    assert element_strides(gathered)[1:] == strides
    scattered = comm.reduce_scatter(gathered, "sum")
    assert scattered.shape == shape and np.array_equal(scattered, x)
    assert element_strides(scattered) == strides
    assert comm.barrier() is None


def test_one_rank_bool(comm):
    b = np.array([True, False])
    assert comm.allreduce(b, "sum").tolist() == [True, False]


@needs_torch
def test_one_rank_integer_and_torch(comm):
    x = torch.arange(-6, 6, dtype=torch.int32).reshape(3, 4).t()
    assert (
        comm.allreduce(x, "avg") is x
        and x.tolist() == torch.arange(-6, 6, dtype=torch.int32).reshape(3, 4).t().tolist()
    )
    y = torch.tensor([1.5, -2.25], dtype=torch.bfloat16)
    assert comm.allreduce(y, denseccl.PreMulSum(0.5)).tolist() == [0.75, -1.125]


def test_one_rank_async(comm):
    x = np.arange(6.0).reshape(2, 3).T
    work = comm.allreduce(x, "sum", async_op=True)
    assert isinstance(work, denseccl.Work)
    assert work.wait() is x and work.is_completed() and work.result is x
    gathered = comm.allgather(x, async_op=True).wait()
    assert np.array_equal(gathered[0], x)


class ExposesArrayInterface:
    """A host array known only through ``__array_interface__`` (as from a C extension)."""

    def __init__(self, array):
        self.__array_interface__ = array.__array_interface__
        self.keep = array


def test_in_place_results_are_the_objects_passed(comm):
    """In place means the call returns ``x`` itself, whatever kind of host array it is; the
    values are those of the NumPy view of its memory."""
    base = np.arange(6.0).reshape(2, 3).T
    exposed = ExposesArrayInterface(base)
    assert comm.allreduce(exposed, "max") is exposed
    assert comm.broadcast(exposed, 0) is exposed
    assert comm.reduce(exposed, 0) is exposed
    out = ExposesArrayInterface(np.zeros((2, 3)).T)
    assert comm.allreduce(base, out=out) is out and np.array_equal(out.keep, base)

    class ExposesDLPack:
        def __init__(self, array):
            self.array = array

        def __dlpack__(self, **kwargs):
            return self.array.__dlpack__(**kwargs)

        def __dlpack_device__(self):
            return self.array.__dlpack_device__()

    dl = ExposesDLPack(np.arange(3.0))
    assert comm.allreduce(dl) is dl
    gathered = comm.allgather(exposed)  # a new result: a NumPy array in the block's layout
    assert isinstance(gathered, np.ndarray) and np.array_equal(gathered[0], base)


def test_out_may_alias_the_input_exactly(comm):
    x = np.arange(4.0)
    assert comm.allreduce(x, out=x) is x and x.tolist() == [0.0, 1.0, 2.0, 3.0]


def test_read_only_input_with_out(comm):
    x = np.arange(4.0)
    x.flags.writeable = False
    out = np.zeros(4)
    assert comm.allreduce(x, out=out) is out and out.tolist() == [0.0, 1.0, 2.0, 3.0]
    assert comm.reduce(x, 0, out=out) is out
    assert comm.allgather(x).tolist() == [[0.0, 1.0, 2.0, 3.0]]
    assert comm.broadcast(x, 0) is x  # the root only reads


def test_allgather_in_place_own_block(comm):
    out = np.zeros((1, 2, 3), np.int64)
    out[0] = [[1, 2, 3], [4, 5, 6]]
    assert comm.allgather(out[0], out=out) is out
    assert out.tolist() == [[[1, 2, 3], [4, 5, 6]]]


# -- validation errors -----------------------------------------------------------------------


def _ro(array):
    array.flags.writeable = False
    return array


def _f32(shape, order="C"):
    return np.asarray(np.arange(np.prod(shape), dtype=np.float32).reshape(shape), order=order)


def _overlapping_pair():
    base = np.arange(10.0)
    return base[:6], base[3:9]


def _torch_arrays(make):
    """The arrays of a case that needs torch; None (the case skips) without torch."""
    return None if torch is None else make()


def _float8(name):
    return _torch_arrays(lambda: [torch.zeros(4, dtype=getattr(torch, name))])


def _cases():
    """(id, arrays, call, fragments): call(comm, *arrays) must raise LayoutError with every
    fragment in its message."""
    gapped = np.arange(24.0).reshape(4, 6)[:, ::2]
    expanded = np.lib.stride_tricks.as_strided(np.arange(3.0), (4, 3), (0, 8))
    fix_dense = "np.ascontiguousarray"
    x, inside = _overlapping_pair()
    packed = np.zeros(4, dtype=[("a", "i1"), ("b", "f4")])["b"]
    return [
        ("gapped", [gapped], lambda c, a: c.allreduce(a),
         ["shape (4, 3)", "strides (6, 2)", "not non-overlapping and dense", fix_dense]),
        ("gapped-reduce", [gapped], lambda c, a: c.reduce(a, 0), ["shape (4, 3)", "strides (6, 2)", fix_dense]),
        ("gapped-broadcast", [gapped], lambda c, a: c.broadcast(a), ["shape (4, 3)", "strides (6, 2)", fix_dense]),
        ("gapped-allgather", [gapped], lambda c, a: c.allgather(a), ["shape (4, 3)", "strides (6, 2)", fix_dense]),
        ("expanded", [expanded], lambda c, a: c.allreduce(a),
         ["shape (4, 3)", "strides (0, 1)", "repeats elements", fix_dense]),
        ("expanded-torch", _torch_arrays(lambda: [torch.arange(3.0).expand(4, 3)]), lambda c, a: c.allreduce(a),
         ["shape (4, 3)", "strides (0, 1)", "t.contiguous()"]),
        ("read-only-allreduce", [_ro(_f32((2, 3)))], lambda c, a: c.allreduce(a),
         ["read-only", "shape (2, 3)", "strides (3, 1)", "out="]),
        ("read-only-reduce-root", [_ro(_f32((2, 3)))], lambda c, a: c.reduce(a, 0),
         ["read-only", "shape (2, 3)", "out="]),
        ("read-only-out", [_f32((2, 3)), _ro(_f32((2, 3)))], lambda c, a, o: c.allreduce(a, out=o),
         ["out is read-only", "writable"]),
        ("out-layout", [_f32((3, 4)), _f32((3, 4), "F")], lambda c, a, o: c.allreduce(a, out=o),
         ["out has float32 shape (3, 4) strides (1, 3)", "must have the layout float32 shape (3, 4) strides (4, 1)",
          "empty_like"]),
        ("out-shape", [_f32((3, 4)), _f32((4, 3))], lambda c, a, o: c.allreduce(a, out=o),
         ["shape (4, 3)", "shape (3, 4)", "empty_like"]),
        ("out-dtype", [_f32((3, 4)), np.zeros((3, 4))], lambda c, a, o: c.allreduce(a, out=o),
         ["float64 shape (3, 4)", "float32 shape (3, 4)"]),
        ("out-layout-reduce", [_f32((3, 4)), _f32((3, 4), "F")], lambda c, a, o: c.reduce(a, 0, out=o),
         ["strides (1, 3)", "strides (4, 1)"]),
        ("out-partial-overlap", [x, inside], lambda c, a, o: c.allreduce(a, out=o),
         ["overlaps the input", "separate array"]),
        ("out-partial-overlap-reduce", [x, inside], lambda c, a, o: c.reduce(a, 0, out=o), ["overlaps"]),
        ("object-dtype", [np.array([1, None], dtype=object)], lambda c, a: c.allreduce(a), ["object", "numeric"]),
        ("float8-allreduce", _float8("float8_e4m3fn"), lambda c, a: c.allreduce(a),
         ["float8_e4m3fn is not supported by the mpi transport"]),
        ("float8-broadcast", _float8("float8_e4m3fn"), lambda c, a: c.broadcast(a),
         ["float8_e4m3fn", "not supported"]),
        ("float8-allgather", _float8("float8_e5m2"), lambda c, a: c.allgather(a),
         ["float8_e5m2", "not supported"]),
        ("bad-op", [_f32((2,))], lambda c, a: c.allreduce(a, "average"), ["unknown reduction op 'average'", "'sum'"]),
        ("bad-op-reduce-scatter", [_f32((1, 2))], lambda c, a: c.reduce_scatter(a, "xor"),
         ["unknown reduction op 'xor'"]),
        ("min-complex", [np.zeros(3, np.complex64)], lambda c, a: c.allreduce(a, "min"),
         ["op min is not defined for dtype complex64", "allowed"]),
        ("max-complex-reduce", [np.zeros(3, np.complex128)], lambda c, a: c.reduce(a, 0, "max"),
         ["op max", "complex128"]),
        ("avg-bool", [np.zeros(3, bool)], lambda c, a: c.allreduce(a, "avg"), ["op avg is not defined for dtype bool"]),
        ("premul-int", [np.zeros(3, np.int32)], lambda c, a: c.allreduce(a, denseccl.PreMulSum(0.5)),
         ["PreMulSum factor 0.5", "int32"]),
        ("premul-uint-negative", [np.arange(3, dtype=np.uint8)], lambda c, a: c.allreduce(a, denseccl.PreMulSum(-1)),
         ["PreMulSum factor -1 does not fit uint8"]),
        ("premul-int8-too-big", [np.arange(3, dtype=np.int8)], lambda c, a: c.reduce(a, 0, denseccl.PreMulSum(300)),
         ["does not fit int8"]),
        ("not-an-array", [[1.0, 2.0]], lambda c, a: c.allreduce(a), ["expected an array", "list"]),
        ("not-an-array-broadcast", [None], lambda c, a: c.broadcast(a), ["expected an array"]),
        ("root-high", [_f32((2,))], lambda c, a: c.reduce(a, 1), ["root 1 is not a rank", "0 <= root < 1"]),
        ("root-negative", [_f32((2,))], lambda c, a: c.broadcast(a, -1), ["root -1 is not a rank"]),
        ("root-bool", [_f32((2,))], lambda c, a: c.broadcast(a, True), ["root True"]),
        ("root-str", [_f32((2,))], lambda c, a: c.reduce(a, "0"), ["root '0'"]),
        ("byte-order", [np.arange(3, dtype=">f4")], lambda c, a: c.allreduce(a), ["byte order", "newbyteorder"]),
        ("byte-strides", [packed], lambda c, a: c.allreduce(a),
         ["shape (4,)", "byte strides (5,)", "itemsize 4", "ascontiguousarray"]),
        ("allgather-out-rows", [_f32((2, 3)), np.zeros((2, 2, 3), np.float32)], lambda c, a, o: c.allgather(a, out=o),
         ["not a stacked buffer for 1 ranks", "dim 0 has size 2", "shape (2, 2, 3)", "Omit out"]),
        ("allgather-out-blocks", [_f32((2, 3)), np.zeros((1, 3, 2), np.float32).transpose(0, 2, 1)],
         lambda c, a, o: c.allgather(a, out=o),
         ["its blocks out[r] have layout float32 shape (2, 3) strides (1, 2)", "strides (3, 1)"]),
        ("allgather-out-overlap", [x, inside.reshape(1, 6)], lambda c, a, o: c.allgather(a, out=o),
         ["overlaps", "out[rank]"]),
        ("allgather-out-read-only", [_f32((2,)), _ro(np.zeros((1, 2), np.float32))],
         lambda c, a, o: c.allgather(a, out=o), ["read-only"]),
        ("reduce-scatter-not-stacked", [_f32((2, 3))], lambda c, a: c.reduce_scatter(a),
         ["reduce_scatter input float32 shape (2, 3) strides (3, 1) is not a stacked buffer for 1 ranks",
          "dim 0 has size 2", "shape (size, *block_shape)"]),
        ("reduce-scatter-0d", [np.float32(1) * np.ones((), np.float32)], lambda c, a: c.reduce_scatter(a), ["0-d"]),
        ("reduce-scatter-gapped-blocks", [np.zeros((1, 4, 6), np.float32)[:, :, ::2]], lambda c, a: c.reduce_scatter(a),
         ["strides (24, 6, 2)", "not dense"]),
        ("reduce-scatter-out-layout", [np.zeros((1, 2, 3), np.float32), np.zeros((3, 2), np.float32).T],
         lambda c, a, o: c.reduce_scatter(a, out=o),
         ["out has float32 shape (2, 3) strides (1, 2)", "strides (3, 1)"]),
        ("reduce-scatter-out-aliases", [np.zeros((1, 2, 3), np.float32)], lambda c, a: c.reduce_scatter(a, out=a[0]),
         ["overlaps"]),
        ("reduce-scatter-min-complex", [np.zeros((1, 2), np.complex64)], lambda c, a: c.reduce_scatter(a, "min"),
         ["op min", "complex64"]),
    ]


CASES = [pytest.param(*case, id=case[0], marks=() if case[1] is not None else needs_torch) for case in _cases()]


def _expected_error(name: str) -> type:
    """The class each case raises: OpError for the op, ArgumentError for a root or a dtype the
    transport cannot move, LayoutError for the rest."""
    if name.startswith(("bad-op", "min-complex", "max-complex", "reduce-scatter-min", "avg-", "premul-")):
        return denseccl.OpError
    if name.startswith(("root-", "float8-")):
        return denseccl.ArgumentError
    return LayoutError


@pytest.mark.parametrize("name, arrays, call, fragments", CASES)
def test_local_validation_errors(comm, name, arrays, call, fragments):
    before = [raw_bytes(a) if _is_array(a) else None for a in arrays]
    with pytest.raises(_expected_error(name)) as info:
        call(comm, *arrays)
    text = str(info.value)
    for fragment in fragments:
        assert fragment in text, f"{fragment!r} not in {text!r}"
    assert isinstance(info.value, ValueError) and isinstance(info.value, denseccl.DenseCCLError)
    for array, snapshot in zip(arrays, before):
        if snapshot is not None:
            assert raw_bytes(array) == snapshot, "a buffer was written"
    # still usable
    assert comm.broken is None
    probe = np.array([1.0, 2.0])
    assert comm.allreduce(probe, "sum").tolist() == [1.0, 2.0]


def _is_array(a):
    return isinstance(a, np.ndarray) or (torch is not None and isinstance(a, torch.Tensor))


def test_out_on_the_root_is_validated(comm):
    # with one rank every call is on the root, so a wrong out is refused
    with pytest.raises(LayoutError):
        comm.reduce(np.zeros(3), 0, out=np.zeros(4))


# -- lifecycle and policy --------------------------------------------------------------------


@needs_mpi4py
def test_closed_communicator_says_so():
    communicator = denseccl.init(backend="mpi")
    communicator.close()
    communicator.close()  # idempotent
    with pytest.raises(denseccl.CommunicatorBrokenError) as info:
        communicator.allreduce(np.zeros(2))
    assert "closed" in str(info.value) and "denseccl.init()" in str(info.value)
    with pytest.raises(denseccl.CommunicatorBrokenError):
        communicator.barrier()


@needs_mpi4py
def test_context_manager_closes():
    with denseccl.init(backend="mpi") as communicator:
        communicator.barrier()
    assert communicator.broken == "closed"


@pytest.mark.parametrize("word, expected", [("always", True), ("off", False), ("OFF", False), ("on", True)])
@needs_mpi4py
def test_check_policy(monkeypatch, word, expected):
    monkeypatch.setenv("DENSECCL_CHECK", word)
    with denseccl.init(backend="mpi") as communicator:
        assert communicator.check is expected
        x = np.arange(3.0)
        assert communicator.allreduce(x).tolist() == [0.0, 1.0, 2.0]
    with denseccl.init(backend="mpi", check="off") as communicator:
        assert communicator.check is False


@needs_mpi4py
def test_timeout_policy(monkeypatch):
    monkeypatch.setenv("DENSECCL_TIMEOUT", "7.5")
    with denseccl.init(backend="mpi") as communicator:
        assert communicator.timeout == 7.5
    with denseccl.init(backend="mpi", timeout=2) as communicator:
        assert communicator.timeout == 2
    with denseccl.init(backend="mpi", timeout=0) as communicator:
        assert communicator.timeout is None  # 0 waits forever
    monkeypatch.delenv("DENSECCL_TIMEOUT")
    with denseccl.init(backend="mpi") as communicator:
        assert communicator.timeout == 300.0


@pytest.mark.parametrize(
    "kwargs, env, fragment",
    [
        ({"backend": "ucx"}, {}, "unknown backend 'ucx'"),
        ({"backend": "mpi", "check": "sometimes"}, {}, "check must be 'always' or 'off'"),
        ({"backend": "mpi"}, {"DENSECCL_CHECK": "maybe"}, "DENSECCL_CHECK"),
        ({"backend": "mpi", "timeout": -1}, {}, "timeout must be >= 0"),
        ({"backend": "mpi"}, {"DENSECCL_TIMEOUT": "soon"}, "DENSECCL_TIMEOUT must be a number"),
        ({"backend": "mpi", "device": 0}, {}, "unexpected options for the mpi backend: device"),
    ],
)
def test_init_errors(monkeypatch, kwargs, env, fragment):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(denseccl.DenseCCLError) as info:
        denseccl.init(**kwargs)
    assert fragment in str(info.value)


@needs_torch
def test_torch_conjugated_and_negated_views_are_refused(comm):
    """A torch view with the conjugate or negative bit set reads differently from its memory:
    moving its raw span would give wrong values (conjugated / negated), so it is a local
    LayoutError naming the fix, and nothing is written."""
    x = torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex64)
    out = torch.zeros(2, dtype=torch.complex64)
    with pytest.raises(LayoutError, match="resolve_conj"):
        comm.allgather(x.conj())
    with pytest.raises(LayoutError, match="resolve_conj"):
        comm.allreduce(x, out=out.conj())
    assert out.tolist() == [0, 0]
    negated = x.conj().imag  # a real tensor with the negative bit
    assert negated.is_neg()
    target = torch.zeros(2)
    with pytest.raises(LayoutError, match="resolve_neg"):
        comm.allreduce(negated, "max", out=target)
    assert target.tolist() == [0, 0]
    stacked = torch.zeros(1, 2, dtype=torch.complex64)
    with pytest.raises(LayoutError, match="resolve_conj"):
        comm.allgather(x, out=stacked.conj())
    assert comm.allgather(x.conj().resolve_conj())[0].tolist() == x.conj().tolist()


@needs_mpi4py
def test_a_failure_seen_by_is_completed_breaks_the_communicator():
    """is_completed() polls like wait(): a transport failure found there (here, in the host step
    that runs once the transfer is done) marks the communicator broken instead of passing silently."""
    from denseccl.communicator import Work
    from denseccl.transport import Pending

    class FailsOnPoll(Pending):
        def test(self) -> bool:
            raise RuntimeError("host step failed")

        def wait(self, deadline):
            self.test()

    own = denseccl.init(backend="mpi", timeout=30)
    x = np.zeros(3)
    work = Work(own.flow, FailsOnPoll(), x, None)
    with pytest.raises(RuntimeError, match="host step failed"):
        work.is_completed()
    assert own.broken is not None and "transport failure" in own.broken
    with pytest.raises(denseccl.CommunicatorBrokenError):
        own.allreduce(x)


@pytest.mark.parametrize("op", ["sum", denseccl.ReduceOp.SUM, denseccl.ReduceOp.MAX])
def test_repeated_calls_are_prepared_whether_the_op_is_a_name_or_a_member(comm, op):
    """A repeated in-place allreduce / reduce is a cache hit for an op given by name and by
    ``ReduceOp`` member alike (torch's adapter and direct callers pass members)."""
    x = np.arange(12, dtype=np.float32).reshape(3, 4).T  # a permuted layout
    for collective in (comm.allreduce, lambda a, o: comm.reduce(a, 0, o)):
        comm.flow.calls.clear()
        for _ in range(3):
            assert collective(x, op) is x
        assert len(comm.flow.calls) == 1, comm.flow.calls
    np.testing.assert_array_equal(x, np.arange(12, dtype=np.float32).reshape(3, 4).T)
