"""One-process tests of the torch adapter: registration, op mapping, tensor layout helpers,
layout-preserving buckets, the progress engine, the Gradient Layout Contract tools and the
DataParallel layout logic (replicas and reduction on CPU devices)."""

from __future__ import annotations

import datetime
import time

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402

import denseccl  # noqa: E402
import denseccl.torch as dt  # noqa: E402
from denseccl.config import MPI_LAUNCH_VARIABLES  # noqa: E402
from denseccl.torch import _tensors, buckets  # noqa: E402
from denseccl.torch.process_group import ProcessGroupDenseCCL  # noqa: E402
from denseccl.torch.progress import AsyncWork, Operation, Progress, completed_work, new_future  # noqa: E402

pytestmark = pytest.mark.torch

CL = torch.channels_last


def key(t):
    return tuple(None if n == 1 else s for n, s in zip(t.shape, t.stride()))


def layouts():
    """Tensors of many dense layouts, filled with distinct values."""
    made = {
        "row-major": torch.empty(3, 5),
        "transposed": torch.empty(5, 3).t(),
        "channels-last": torch.empty(2, 3, 4, 5).to(memory_format=CL),
        "permuted": torch.empty(4, 2, 5, 3).permute(1, 3, 0, 2),
        "size-1 strides": torch.empty(12).as_strided((3, 1, 4), (4, 99, 1)),
        "0-d": torch.empty(()),
        "empty": torch.empty(0, 3),
        "float64 channels-last": torch.empty(2, 3, 2, 2, dtype=torch.float64).to(memory_format=CL),
    }
    for i, t in enumerate(made.values()):
        t.copy_(torch.arange(t.numel(), dtype=t.dtype).reshape(t.shape) + 100 * i)
    return made


# -- registration and ops ---------------------------------------------------------------------


def test_import_registers_backend_for_cpu_and_cuda():
    assert dist.Backend.DENSECCL == "denseccl"
    assert dist.Backend.backend_capability["denseccl"] == ["cpu", "cuda"]
    assert "DENSECCL" in dist.Backend._plugins
    assert dist.Backend._plugins["DENSECCL"].extended_api


def test_core_api_takes_torch_and_mpi4py_ops():
    """denseccl's own calls (and the process group, which passes torch's op on) accept torch's
    ReduceOp members and mpi4py's ops that name a supported reduction; the others raise OpError
    (a ValueError, not a LayoutError) listing what is supported."""
    from denseccl.ops import ReduceOp, as_op

    R = dist.ReduceOp
    for given, want in (
        (R.SUM, ReduceOp.SUM),
        (R.PRODUCT, ReduceOp.PRODUCT),
        (R.MIN, ReduceOp.MIN),
        (R.MAX, ReduceOp.MAX),
        (R.AVG, ReduceOp.AVG),
    ):
        assert as_op(given) == want
    assert as_op(dist._make_nccl_premul_sum(0.5)) == denseccl.PreMulSum(0.5)
    assert as_op(dist._make_nccl_premul_sum(torch.tensor([0.25]))) == denseccl.PreMulSum(0.25)
    for bad in (R.BAND, R.BOR, R.BXOR):
        with pytest.raises(denseccl.OpError, match="SUM, PRODUCT, MIN, MAX, AVG") as info:
            as_op(bad)
        assert isinstance(info.value, ValueError) and not isinstance(info.value, denseccl.LayoutError)
    MPI = pytest.importorskip("mpi4py.MPI")
    for given, want in (
        (MPI.SUM, ReduceOp.SUM),
        (MPI.PROD, ReduceOp.PRODUCT),
        (MPI.MIN, ReduceOp.MIN),
        (MPI.MAX, ReduceOp.MAX),
    ):
        assert as_op(given) == want
    for bad, name in ((MPI.LAND, "LAND"), (MPI.BXOR, "BXOR"), (MPI.MAXLOC, "MAXLOC")):
        with pytest.raises(denseccl.OpError, match=f"MPI.{name} is not supported.*MPI.SUM, MPI.PROD, MPI.MIN"):
            as_op(bad)
    with pytest.raises(denseccl.OpError, match="'sum', 'prod', 'min', 'max', 'avg'"):
        as_op("bogus")


@pytest.fixture()
def without_mpi_launch(monkeypatch):
    """As if no MPI launcher had started this process."""
    for name in MPI_LAUNCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def test_group_without_mpi_launch_whose_peer_never_joins_times_out(without_mpi_launch):
    """Without an MPI launcher CPU tensors move over the gloo engine, made from the group's
    store; a peer that never joins makes its creation raise within the timeout."""
    started = time.monotonic()
    with pytest.raises(denseccl.CollectiveTimeoutError, match="never joined"):
        ProcessGroupDenseCCL(dist.HashStore(), 0, 2, datetime.timedelta(seconds=2))
    assert time.monotonic() - started < 10


def test_one_rank_group_without_mpi_launch_runs_on_the_gloo_engine(without_mpi_launch):
    pg = ProcessGroupDenseCCL(dist.HashStore(), 0, 1, datetime.timedelta(seconds=5))
    assert pg.getBackendName() == "denseccl" and pg.size() == 1 and pg.host_communicator.backend == "gloo"
    x = torch.arange(6.0).view(2, 3).t()
    pg.allreduce([x]).wait()
    assert torch.equal(x, torch.arange(6.0).view(2, 3).t()) and x.stride() == (1, 3)
    pg.shutdown()



def test_calls_after_shutdown_say_the_group_was_shut_down(without_mpi_launch):
    """After shutdown every call names the reason, a barrier included (it must not go looking
    for a GPU communicator instead)."""
    pg = ProcessGroupDenseCCL(dist.HashStore(), 0, 1, datetime.timedelta(seconds=5))
    pg.shutdown()
    calls = {
        "barrier": lambda: pg.barrier(),
        "allreduce": lambda: pg.allreduce([torch.ones(3)]),
        "send": lambda: pg.send([torch.ones(3)], 0, 0),
    }
    for name, call in calls.items():
        with pytest.raises(denseccl.DenseCCLError, match="this process group has been shut down"):
            call()
            pytest.fail(f"{name} ran after shutdown")

def test_arguments_that_are_not_layouts_raise_argument_error(without_mpi_launch):
    """A wrong list length, device or tensor count is an ArgumentError naming the argument; a
    layout (an output of another shape, a gapped tensor) stays a LayoutError."""
    pg = ProcessGroupDenseCCL(dist.HashStore(), 0, 1, datetime.timedelta(seconds=5))
    x = torch.ones(3)
    with pytest.raises(denseccl.ArgumentError, match="output list has 2 tensors; it needs one per rank"):
        pg.allgather([[torch.empty(3), torch.empty(3)]], [x]).wait()
    with pytest.raises(denseccl.ArgumentError, match="2 output lists for 1 inputs"):
        pg.allgather([[torch.empty(3)], [torch.empty(3)]], [x]).wait()
    with pytest.raises(denseccl.ArgumentError, match="gather takes one input tensor, got 2"):
        pg.gather([[torch.empty(3)]], [x, x], dist.GatherOptions()).wait()
    with pytest.raises(denseccl.ArgumentError, match="no tensors given"):
        pg.allreduce([]).wait()
    with pytest.raises(denseccl.ArgumentError, match="tensors on meta are not supported"):
        pg.allreduce([torch.empty(3, device="meta")]).wait()
    with pytest.raises(denseccl.ArgumentError, match="no all-to-all or point-to-point on device"):
        pg.send([torch.empty(3, device="meta")], 0)
    with pytest.raises(denseccl.LayoutError, match="tensor 0 of the output list is torch.float32 of shape"):
        pg.allgather([[torch.empty(4)]], [x]).wait()
    with pytest.raises(denseccl.LayoutError, match="not non-overlapping and dense"):
        pg.allreduce([torch.ones(6)[::2]]).wait()
    pg.allreduce([x]).wait()  # still usable
    assert torch.equal(x, torch.ones(3))
    pg.shutdown()


def test_all_to_all_and_point_to_point_argument_checks():
    """Split sizes and tensor counts are arguments (ArgumentError), a dim 0 that does not divide
    is the tensor's shape (LayoutError); all raise before the engine is touched."""
    from denseccl.torch import all_to_all_p2p, p2p

    with pytest.raises(denseccl.ArgumentError, match=r"input split sizes \[1, 1\] must be 3 non-negative numbers"):
        all_to_all_p2p._splits([1, 1], 2, 3, "input")
    with pytest.raises(denseccl.LayoutError, match="dim 0 \\(4\\) does not divide by the 3 ranks"):
        all_to_all_p2p._splits([], 4, 3, "input")
    assert all_to_all_p2p._splits([], 6, 3, "input") == [2, 2, 2]
    with pytest.raises(denseccl.ArgumentError, match="send takes one tensor, got 2"):
        p2p.send(None, [torch.ones(1), torch.ones(1)], 0, 0)()
    issue, _source = p2p.recv(None, [], 0, 0)
    with pytest.raises(denseccl.ArgumentError, match="recv takes one tensor, got 0"):
        issue()


# -- tensor layout helpers --------------------------------------------------------------------


def test_dense_and_keys():
    for name, t in layouts().items():
        assert _tensors.is_dense(t), name
    assert not _tensors.is_dense(torch.arange(10.0)[::2])
    assert not _tensors.is_dense(torch.ones(3, 1).expand(3, 4))
    assert denseccl.same_layout(torch.empty(4, 3, 1, 1), torch.empty(4, 3, 1, 1).to(memory_format=CL))
    assert not denseccl.same_layout(torch.empty(3, 4), torch.empty(4, 3).t())


def test_overlap_of_spans():
    base = torch.empty(10)
    assert _tensors.overlap(base[2:5], base[4:8]) and _tensors.overlap(base, base[9:])
    assert not _tensors.overlap(base[:5], base[5:])  # adjacent spans share no byte
    assert not _tensors.overlap(base[3:3], base) and not _tensors.overlap(base, torch.empty(10))
    assert _tensors.overlap(base.view(2, 5).t(), base[4:5])  # spans, not logical order


def test_dense_strides_like_keeps_the_dim_order_of_gapped_tensors():
    gapped = torch.empty(2, 3, 4, 10).to(memory_format=CL)[..., ::2]
    assert _tensors.dense_strides_like(gapped) == torch.empty(2, 3, 4, 5).to(memory_format=CL).stride()
    assert _tensors.dense_strides_like(torch.arange(10.0)[::2]) == (1,)


@pytest.mark.parametrize("name", list(layouts()))
def test_restrided_gives_the_target_strides(name):
    target = layouts()[name]
    source = target.contiguous() if target.dim() else target.clone()
    out = _tensors.restrided(source, target.stride())
    assert torch.equal(out, target) and key(out) == key(target)
    assert _tensors.restrided(target, target.stride()) is target


def test_stacked_view_and_whether_dim_0_is_outermost():
    size = 3
    concat = torch.empty(6, 4)
    view = _tensors.stacked_view(concat, (2, 4), size, "out")
    assert view.shape == (3, 2, 4) and view.data_ptr() == concat.data_ptr()
    assert _tensors.is_stacked(view, size)
    assert _tensors.is_stacked(
        _tensors.stacked_view(torch.empty(6, 3, 4, 5).to(memory_format=CL), (2, 3, 4, 5), size, "out"), size
    )
    transposed = _tensors.stacked_view(torch.empty(4, 6).t(), (2, 4), size, "out")
    assert not _tensors.is_stacked(transposed, size)
    stack = _tensors.staging_stack(transposed, size)
    assert stack.shape == (3, 2, 4) and stack.stride() == (8, 1, 2)  # blocks keep the column-major order
    with pytest.raises(denseccl.LayoutError, match="shape"):
        _tensors.stacked_view(torch.empty(5, 4), (2, 4), size, "out")


# -- buckets ----------------------------------------------------------------------------------


def test_pack_keeps_spans_and_strides_and_unpacks():
    tensors = list(layouts().values())
    packed = buckets.pack(tensors)
    assert {b.dtype for b in packed} == {torch.float32, torch.float64} and len(packed) == 2
    views = buckets.unpacked(packed, len(tensors))
    for t, v in zip(tensors, views):
        assert key(v) == key(t) and torch.equal(v, t)
    for bucket in packed:
        for slot in bucket.slots:
            t = tensors[slot.index]
            run = bucket.flat[slot.offset : slot.offset + slot.numel]
            start, numel = denseccl.layout_of(t).span
            span = t.as_strided((numel,), (1,), t.storage_offset() + start)
            assert torch.equal(run, span), "a slot holds the span as it lies in memory"
    targets = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype).zero_() for t in tensors]
    buckets.unpack(packed, targets)
    for t, target in zip(tensors, targets):
        assert torch.equal(t, target)


def test_pack_with_templates_and_gaps_and_bucket_size():
    params = [torch.empty(4, 3, 2, 2).to(memory_format=CL), torch.empty(5, 3).t()]
    grads = [torch.randn(4, 3, 2, 2), torch.randn(3, 5)]  # row-major
    packed = buckets.pack(grads, like=params)
    for p, g, v in zip(params, grads, buckets.unpacked(packed, 2)):
        assert key(v) == key(p) and torch.equal(v, g)
    gapped = torch.arange(20.0)[::2]
    (bucket,) = buckets.pack([gapped])
    assert torch.equal(bucket.flat, gapped)
    split = buckets.pack([torch.ones(10), torch.ones(10), torch.ones(10)], bucket_elements=15)
    assert [len(b.slots) for b in split] == [2, 1]


# -- the progress engine ----------------------------------------------------------------------


class FakeStep:
    def __init__(self, after: float, error: BaseException = None):
        self.ready_at = time.monotonic() + after
        self.error = error

    def is_completed(self):
        if time.monotonic() < self.ready_at:
            return False
        if self.error:
            raise self.error
        return True

    def wait(self, timeout=None):
        while not self.is_completed():
            time.sleep(0.001)


def test_progress_thread_completes_futures_and_wait_drives():
    progress = Progress("test")
    try:
        value = [torch.ones(2)]
        op = Operation("op", [FakeStep(0.05)], lambda: value, new_future(None), None)
        progress.submit(op)
        work = AsyncWork(progress, op)
        assert not work.is_completed()
        assert work.get_future().wait() is value  # completed by the thread, nobody waits on the work
        assert work.is_completed() and work.is_success() and work.exception() is None
        op2 = Operation("op2", [FakeStep(0.05)], lambda: [torch.zeros(1)], new_future(None), None)
        progress.submit(op2)
        AsyncWork(progress, op2).wait(datetime.timedelta(seconds=5))
        assert op2.future.done()
    finally:
        progress.stop()


def test_progress_errors_reach_future_and_wait():
    progress = Progress("test")
    try:
        op = Operation("boom", [FakeStep(0.01, RuntimeError("transport broke"))], lambda: [], new_future(None), None)
        progress.submit(op)
        work = AsyncWork(progress, op)
        with pytest.raises(RuntimeError, match="transport broke"):
            work.wait()
        assert not work.is_success()
        with pytest.raises(RuntimeError, match="transport broke"):
            op.future.wait()
    finally:
        progress.stop()


def test_then_callbacks_may_wait_on_other_work():
    progress = Progress("test")
    try:
        first = Operation("a", [FakeStep(0.02)], lambda: ["a"], new_future(None), None)
        second = Operation("b", [FakeStep(0.2)], lambda: ["b"], new_future(None), None)
        progress.submit(first)
        progress.submit(second)
        chained = first.future.then(lambda f: AsyncWork(progress, second).wait() and f.value() + second.future.value())
        assert chained.wait() == ["a", "b"]
    finally:
        progress.stop()


def test_completed_work():
    work = completed_work([torch.ones(1)])
    assert work.is_completed() and work.wait()
    assert torch.equal(work.get_future().value()[0], torch.ones(1))


# -- Gradient Layout Contract tools -----------------------------------------------------------


class RowMajorGrad(torch.autograd.Function):
    """Sums its input; its backward returns a row-major gradient."""

    @staticmethod
    def forward(ctx, weight):
        ctx.shape = weight.shape
        return weight.sum()

    @staticmethod
    def backward(ctx, grad):
        return torch.ones(ctx.shape, dtype=grad.dtype) * grad


def conv_module():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 2), nn.Conv2d(4, 2, 1)).to(memory_format=CL)


def test_violations_list_grads_with_other_strides():
    module = conv_module()
    assert dt.grad_layout_violations(module) == []
    module[0].weight.grad = torch.zeros(module[0].weight.shape)  # row-major grad on a channels-last param
    module[1].weight.grad = torch.zeros(module[1].weight.shape)  # [2, 4, 1, 1]: differs only on size-1 dims
    module(torch.randn(2, 3, 5, 5)).sum().backward()
    found = dt.grad_layout_violations(module)
    assert [v.name for v in found] == ["0.weight"]
    assert found[0].grad_strides == (12, 4, 2, 1) and found[0].expected_strides == module[0].weight.stride()
    assert "0.weight" in str(found[0])
    assert dt.restride_grads(module) == 1 and dt.grad_layout_violations(module) == []


@pytest.mark.parametrize("create_graph", [False, True])
def test_enforce_restrides_after_each_accumulation(create_graph):
    module = conv_module()
    weight = module[0].weight
    with dt.enforce_grad_layout(module) as hooks:
        weight.grad = torch.zeros(weight.shape)  # breaks the contract before accumulation
        if create_graph:
            weight.grad.requires_grad_()
        RowMajorGrad.apply(weight).backward(create_graph=create_graph)
        assert dt.grad_layout_violations(module) == []
        assert key(weight.grad) == key(weight) and torch.equal(weight.grad, torch.ones(weight.shape))
        if create_graph:
            assert weight.grad.requires_grad  # still differentiable
        module(torch.randn(2, 3, 5, 5)).sum().backward(create_graph=create_graph)
        assert dt.grad_layout_violations(module) == []
        assert len(hooks.handles) == 4
    assert hooks.handles == []
    weight.grad = torch.zeros(weight.shape)
    RowMajorGrad.apply(weight).backward()
    assert [v.name for v in dt.grad_layout_violations(module)] == ["0.weight"]  # hooks are gone


def test_create_graph_accumulation_without_enforcement_breaks_the_contract():
    weight = nn.Parameter(torch.randn(4, 3, 2, 2).to(memory_format=CL))
    weight.grad = torch.zeros(weight.shape)
    RowMajorGrad.apply(weight).backward(create_graph=True)  # torch warns (once per process)
    holder = nn.Module()
    holder.weight = weight
    assert len(dt.grad_layout_violations(holder)) == 1


# -- DataParallel layout logic on CPU devices -------------------------------------------------


def test_broadcast_coalesced_keeps_strides():
    tensors = list(layouts().values())
    copies = dt.broadcast_coalesced(tensors, ["cpu", "cpu", "cpu"])
    assert all(a is b for a, b in zip(copies[0], tensors)), "the source device gets the originals"
    for per_device in copies[1:]:
        for t, c in zip(tensors, per_device):
            assert key(c) == key(t) and torch.equal(c, t)
            assert c.numel() == 0 or c.data_ptr() != t.data_ptr()


def test_reduce_add_coalesced_sums_into_param_layouts():
    params = [torch.empty(4, 3, 2, 2).to(memory_format=CL), torch.empty(5, 3).t(), torch.empty(2, dtype=torch.float64)]
    grads = [[torch.randn(p.shape, dtype=p.dtype) for p in params] for _ in range(3)]
    grads[1][0] = grads[1][0].contiguous(memory_format=CL)
    out = dt.reduce_add_coalesced(grads, "cpu", params)
    for i, p in enumerate(params):
        assert key(out[i]) == key(p)
        torch.testing.assert_close(out[i], sum(g[i] for g in grads))


def net():
    torch.manual_seed(3)
    model = nn.Sequential(nn.Conv2d(3, 8, 2), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 4, 2))
    return model.to(memory_format=CL).double()


def test_replicate_keeps_layouts_and_reduces_grads_into_param_layouts():
    model = net()
    x = torch.randn(6, 3, 6, 6, dtype=torch.float64)
    replicas = dt.replicate(model, ["cpu", "cpu", "cpu"])
    for replica in replicas:
        for (name, p), r in zip(model.named_parameters(), _replica_params(replica)):
            assert key(r) == key(p), f"{name}: replica strides {r.stride()} != {p.stride()}"
            assert torch.equal(r, p)
        for b, rb in zip(model.buffers(), replica.buffers()):
            assert key(rb) == key(b) and torch.equal(rb, b)
    loss = sum(replica(chunk).square().sum() for replica, chunk in zip(replicas, x.chunk(3)))
    loss.backward()
    expected = _chunked_grads(net(), x)
    for name, p in model.named_parameters():
        assert key(p.grad) == key(p), f"{name}: grad strides {p.grad.stride()} != {p.stride()}"
        torch.testing.assert_close(p.grad, expected[name])


def _replica_params(replica):
    out = []
    for module in replica.modules():
        out.extend(t for t in module._former_parameters.values())
    return out


def _chunked_grads(model, x):
    """Per-chunk forward (batch norm statistics per chunk, as in data parallel), summed."""
    model.zero_grad()
    for chunk in x.chunk(3):
        model(chunk).square().sum().backward()
    return {name: p.grad.clone() for name, p in model.named_parameters()}


def test_replicate_detached_for_inference():
    model = net()
    with torch.no_grad():
        replicas = dt.replicate(model, ["cpu", "cpu"], detach=True)
    for replica in replicas[1:]:
        for p, r in zip(model.parameters(), _replica_params(replica)):
            assert not r.requires_grad and key(r) == key(p)


def test_dataparallel_without_gpus_runs_the_module_like_nn_dataparallel():
    if torch.cuda.is_available():
        pytest.skip("CPU-only behaviour")
    model = net()
    ours, theirs = dt.DataParallel(model), nn.DataParallel(model)
    assert ours.device_ids == theirs.device_ids == []
    x = torch.randn(4, 3, 6, 6, dtype=torch.float64)
    torch.testing.assert_close(ours(x), theirs(x))
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert isinstance(ours, nn.DataParallel) and ours.module is model
    ours(x).sum().backward()
    assert dt.grad_layout_violations(model) == []


def test_timeouts_take_timedelta_or_seconds_everywhere():
    """denseccl.init, Work.wait / synchronize and the torch group take a timeout as a
    datetime.timedelta or as seconds (Work.wait used to raise a raw TypeError on a timedelta)."""
    pytest.importorskip("mpi4py")
    import numpy as np

    with denseccl.init(backend="mpi", timeout=datetime.timedelta(seconds=7)) as comm:
        assert comm.timeout == 7
        x = np.ones(3)
        assert comm.allreduce(x, async_op=True).wait(timeout=datetime.timedelta(seconds=5)) is x
        assert comm.allreduce(x, async_op=True).wait(timeout=5) is x
        assert comm.allreduce(x, async_op=True).synchronize(timeout=datetime.timedelta(milliseconds=2500)) is x
        with pytest.raises(denseccl.DenseCCLError, match="number of seconds or a datetime.timedelta"):
            comm.allreduce(x, async_op=True).wait(timeout="soon")
    with denseccl.init(backend="mpi", timeout=12.5) as comm:
        assert comm.timeout == 12.5


def test_denseccl_calls_no_deprecated_torch_distributed_function():
    """torch 2.13 deprecates ``all_gather_into_tensor`` and ``reduce_scatter_tensor`` (their
    successors: ``all_gather_single``, ``reduce_scatter_single``) and a few others; every call
    warns. denseccl's own code (the backend, its benchmarks) calls none of them, so no
    FutureWarning escapes from it (``denseccl.torch.single_tensor`` falls back to the old names on
    older torch). Found by reading each module's calls of ``torch.distributed`` functions."""
    import ast
    import warnings
    from pathlib import Path

    if not hasattr(dist, "all_gather_single"):
        pytest.skip("torch before 2.13 deprecates neither spelling")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # dir(dist) includes names whose mere lookup warns
        deprecated = {name for name in dir(dist) if getattr(getattr(dist, name), "__deprecated__", None)}
    assert {"all_gather_into_tensor", "reduce_scatter_tensor"} <= deprecated
    found = []
    for path in sorted(Path(denseccl.__file__).parent.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        module_names = {"torch.distributed"}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                module_names |= {a.asname for a in node.names if a.name == "torch.distributed" and a.asname}
            elif isinstance(node, ast.ImportFrom) and node.module == "torch":
                module_names |= {a.asname or a.name for a in node.names if a.name == "distributed"}
            elif isinstance(node, ast.ImportFrom) and node.module == "torch.distributed":
                found += [f"{path}:{node.lineno}: imports {a.name}" for a in node.names if a.name in deprecated]
        for node in ast.walk(tree):
            called = node.func if isinstance(node, ast.Call) else None
            if isinstance(called, ast.Attribute) and called.attr in deprecated:
                if ast.unparse(called.value) in module_names:
                    found.append(f"{path}:{node.lineno}: {ast.unparse(node)}")
    assert not found, "calls of deprecated torch.distributed functions:\n" + "\n".join(found)
