"""An all-to-all or point-to-point call that fails on one rank after its transfer began (here: an
interrupt in its wait) breaks the communicator on every rank: its peer's wait, or its next call,
raises CommunicatorBrokenError naming that rank, instead of waiting for the timeout.

usage: p2p_faults.py CASE     (2 ranks; torchrun: the gloo engine, mpiexec: MPI)

Rank 1 is interrupted (a timer's KeyboardInterrupt) half a second into a wait its peer leaves
unanswered: ``interrupt-recv`` (``dist.recv``), ``interrupt-irecv`` (``irecv(...).wait()``),
``interrupt-alltoall`` (``all_to_all_single``, rank 0 calling late). Or its recv fails in its
completion: ``short-message`` (MPI: rank 0 sends 3 floats into rank 1's 4; MismatchError),
after which rank 0 receives from it. Then rank 0:

- ``recv`` cases (MPI): it waits to receive from rank 1, which never sends; that wait raises.
- ``alltoall``: it makes its own all-to-all call 1.5 s late; the call raises at once.

Both errors name rank 1 and come well before the 60 s timeout; rank 1's next call raises
CommunicatorBrokenError ("interrupted"). A first exchange checks values against NumPy. (gloo's
send and recv waits block inside gloo and cannot be cut short: there the peer hears at its next
call, which the alltoall case checks.)
"""

from __future__ import annotations

import signal
import sys
import time
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

import denseccl
import denseccl.torch
from tests.support.checker import Checker


def interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def victim(case: str, check: Checker) -> None:
    buffer = torch.empty(64)
    if case == "short-message":
        short = torch.full((4,), -1.0)
        check.raises("recv of fewer bytes than the tensor holds", denseccl.MismatchError,
                     lambda: dist.recv(short, src=0, tag=5), "12 bytes into a tensor of 16 bytes")
        check.raises("rank 1's next call", denseccl.CommunicatorBrokenError, lambda: dist.send(buffer, 0),
                     "failed after its transfer began")
        return
    signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.5)
    try:
        if case == "interrupt-recv":
            dist.recv(buffer, 0)
        elif case == "interrupt-irecv":
            dist.irecv(buffer, 0).wait()
        else:
            dist.all_to_all_single(torch.empty(64), buffer)
        check.fail(f"{case}: the call nobody answered returned")
    except KeyboardInterrupt:
        pass
    check.raises("rank 1's next call", denseccl.CommunicatorBrokenError, lambda: dist.send(buffer, 0), "interrupted")


def peer(case: str, check: Checker) -> None:
    buffer = torch.empty(64)
    if case == "short-message":
        dist.send(torch.ones(3), dst=1, tag=5)
    began = time.monotonic()
    if case == "interrupt-alltoall":
        time.sleep(1.5)
        call, what = (lambda: dist.all_to_all_single(torch.empty(64), buffer)), "all-to-all"
    else:
        call, what = (lambda: dist.recv(buffer, 1)), "recv from rank 1"
    error = check.raises(f"rank 0's {what}", denseccl.CommunicatorBrokenError, call, "rank 1 gave up")
    waited = time.monotonic() - began
    if case.startswith("interrupt-recv") or case == "interrupt-irecv":  # it was waiting in that call
        check.check(what in str(error), f"the error names the call: {error}")
    check.check(waited < 30, f"rank 0 heard it after {waited:.1f} s, not before half the timeout")
    print(f"rank 0 heard rank 1's failure after {waited:.2f} s", flush=True)


def main() -> None:
    case = sys.argv[1]
    denseccl.torch.init_process_group(timeout=timedelta(seconds=60))  # torchrun's variables, or MPI's
    rank, size = dist.get_rank(), dist.get_world_size()
    check = Checker(f"p2p-faults-{case}", rank, size)
    sent = torch.arange(12, dtype=torch.float32).reshape(3, 4) + 100 * rank
    got = torch.empty((4, 3), dtype=torch.float32).t()  # column-major
    if rank == 0:
        dist.send(sent, 1)
        dist.recv(got, 1)
    else:
        dist.recv(got, 0)
        dist.send(sent, 0)
    want = np.arange(12, dtype=np.float32).reshape(3, 4) + 100 * (1 - rank)
    check.check(np.array_equal(got.numpy(), want), f"first exchange: got {got}, want {want}")
    dist.barrier()
    (victim if rank == 1 else peer)(case, check)
    check.done()  # no destroy_process_group: the communicator is broken on both ranks


if __name__ == "__main__":
    main()
