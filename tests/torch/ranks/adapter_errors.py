"""Local failures in the torch adapter on ONE rank only (issue 10 item 3): an unsupported op,
a meta tensor, a device denseccl does not serve, tensors of mixed devices in one call, a bad
PREMUL_SUM factor for the dtype, malformed argument lists, bad all-to-all splits. Every rank must raise (the
wrong rank its own error, the others a MismatchError) and the next, correct collective must
return the right values on every rank (nothing paired with a later call). The wrong rank is
rank ``size - 1`` and then rank 0, so that both the root side and the others are covered.
Run with mpiexec -n N or torchrun --nproc-per-node N."""

from __future__ import annotations

import itertools

import torch
import torch.distributed as dist
from common import Checker, init, values

import denseccl

init()
rank, size = dist.get_rank(), dist.get_world_size()
check = Checker(rank)
torch.set_num_threads(1)
seeds = itertools.count(500)
R = dist.ReduceOp
meta = lambda *shape: torch.empty(*shape, device="meta")  # noqa: E731


def good_after(what: str) -> None:
    """A correct all_reduce right after: nothing of the failed call may pair with it."""
    seed = next(seeds)
    x = values(seed, rank, (3, 4), torch.float32).t().contiguous().t()
    dist.all_reduce(x)
    want = torch.stack([values(seed, r, (3, 4), torch.float64) for r in range(size)]).sum(0)
    check.equal(f"correct all_reduce after {what}", x, want, tol=1e-5)


def case(what: str, wrong: int, bad, good, *, asynchronous: bool = False) -> None:
    """``bad()`` on rank ``wrong``, ``good()`` on the others; all must raise."""
    if rank == wrong:
        error = check.raises(f"{what}: the wrong rank raises", Exception, bad)
        check.true(
            f"{what}: the wrong rank's error is its own ({type(error).__name__}: {error})",
            not isinstance(error, denseccl.MismatchError),
        )
    else:

        def run():
            work = good()
            if asynchronous:
                work.wait()

        error = check.raises(f"{what}: a peer raises MismatchError", denseccl.MismatchError, run, "mismatch")
    good_after(what)


for wrong in (size - 1, 0):
    t = lambda: torch.ones(4, dtype=torch.int32)  # noqa: E731
    case("ReduceOp.BAND", wrong, lambda: dist.all_reduce(t(), op=R.BAND), lambda: dist.all_reduce(t()))
    case(
        "ReduceOp.BAND vs async all_reduce",
        wrong,
        lambda: dist.all_reduce(t(), op=R.BXOR),
        lambda: dist.all_reduce(t(), async_op=True),
        asynchronous=True,
    )
    case("meta tensor", wrong, lambda: dist.all_reduce(meta(3, 4)), lambda: dist.all_reduce(torch.ones(3, 4)))
    case(
        "meta tensor in broadcast",
        wrong,
        lambda: dist.broadcast(meta(5), src=0),
        lambda: dist.broadcast(torch.ones(5), src=0),
    )
    case(
        "mixed devices in one all_reduce_coalesced",
        wrong,
        lambda: dist.all_reduce_coalesced([torch.ones(2), meta(2)]),
        lambda: dist.all_reduce_coalesced([torch.ones(2), torch.ones(2)]),
    )
    case(
        "PREMUL_SUM with a fractional factor on int32",
        wrong,
        lambda: dist.all_reduce(torch.ones(3, dtype=torch.int32), op=dist._make_nccl_premul_sum(0.5)),
        lambda: dist.all_reduce(torch.ones(3, dtype=torch.int32), op=dist._make_nccl_premul_sum(2.0)),
    )
    # (complex MAX is refused by torch itself, in Python, before any backend is called)
    case(
        "all_gather with a short output list",
        wrong,
        lambda: dist.all_gather([torch.empty(2)] * (size - 1), torch.ones(2)),
        lambda: dist.all_gather([torch.empty(2) for _ in range(size)], torch.ones(2)),
    )
    case(
        "all_gather_into_tensor with an output of another dtype",
        wrong,
        lambda: dist.all_gather_into_tensor(torch.empty(2 * size, dtype=torch.float64), torch.ones(2)),
        lambda: dist.all_gather_into_tensor(torch.empty(2 * size), torch.ones(2)),
    )
    case(
        "reduce_scatter_tensor with an input of the wrong shape",
        wrong,
        lambda: dist.reduce_scatter_tensor(torch.empty(2), torch.ones(2 * size + 1)),
        lambda: dist.reduce_scatter_tensor(torch.empty(2), torch.ones(2 * size)),
    )
    case(
        "all_to_all_single with splits that do not sum to dim 0",
        wrong,
        lambda: dist.all_to_all_single(torch.empty(size), torch.ones(size), [1] * size, [2] + [1] * (size - 1)),
        lambda: dist.all_to_all_single(torch.empty(size), torch.ones(size)),
    )
    case(
        "all_to_all with a meta tensor",
        wrong,
        lambda: dist.all_to_all(
            [torch.empty(1) for _ in range(size)], [meta(1)] + [torch.ones(1) for _ in range(size - 1)]
        ),
        lambda: dist.all_to_all([torch.empty(1) for _ in range(size)], [torch.ones(1) for _ in range(size)]),
    )
    if wrong == 0:  # the scatter root
        case(
            "scatter with a short scatter_list on the root",
            wrong,
            lambda: dist.scatter(torch.empty(2), [torch.ones(2)] * (size - 1), src=0),
            lambda: dist.scatter(torch.empty(2), None, src=0),
        )

# the all-to-all split check: locally valid splits that do not pair (rank 0 expects 2 rows from
# itself and none from rank 1); every rank sees the same split matrices and raises
receive = [2, 0] + [1] * (size - 2) if rank == 0 else [1] * size
check.raises(
    "all_to_all_single splits that do not pair",
    denseccl.MismatchError,
    lambda: dist.all_to_all_single(torch.empty(size), torch.ones(size), receive, [1] * size),
    "mismatch",
)
good_after("unpaired all-to-all splits")

dist.destroy_process_group()
check.done()
