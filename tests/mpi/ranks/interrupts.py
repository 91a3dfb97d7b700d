"""An interrupt (KeyboardInterrupt from a timer signal) in a wait of a collective, on real ranks,
under mpiexec (MPI) or torchrun (the gloo engine).

usage: interrupts.py WAIT FORM ELEMENTS

Rank 0 is the victim. At call ``ARMED`` its peers hold back (``WAIT`` = ``agreement``: before
the call, so rank 0 waits in the agreement step; ``transfer``: inside the transport's start,
after the agreement, so rank 0 waits for the transfer) while a timer raises KeyboardInterrupt in rank 0 a random time
into its wait. ``FORM``: ``inplace`` (repeated in-place calls: the prepared path, on the gloo
engine the host path) or ``out`` (out-of-place: validated each time, the transport called each
time, as the ``transfer`` wait needs), ``allgather`` or ``reduce_scatter`` (into a given array;
on the gloo engine's one host through shared memory, the data in the agreement step). Rank 0
then does what a notebook user does after Ctrl-C: it calls again, with the next call's input.
Every rank keeps calling until a call raises.

Checked on every rank: no call ever returns a value other than the sum of every rank's input
of that same call (a call paired with another's); the victim's interrupted call breaks the
communicator (its next call raises CommunicatorBrokenError at once); every peer raises within
a call or two of the interrupt, and the job ends.
"""

from __future__ import annotations

import faulthandler
import os
import random
import signal
import sys
import time

import numpy as np

import denseccl
from tests.support.checker import Checker

CALLS = 12
ARMED = 5
#: how long the peers hold back at the armed call; the victim's timer fires well inside it
HOLD = 0.6


def main() -> None:
    faulthandler.dump_traceback_later(50)  # a rank still here then is stuck: its stacks go to stderr
    wait, form, elements = sys.argv[1], sys.argv[2], int(sys.argv[3])
    comm = denseccl.init(timeout=float(os.environ.get("INTERRUPT_TIMEOUT", "20")))
    rank, size = comm.rank, comm.size
    check = Checker(f"interrupts-{wait}", rank, size)

    def interrupt(*_: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGALRM, interrupt)
    if rank != 0 and wait == "transfer":
        transport = comm.flow.transport
        original = transport.allreduce_now
        calls = [0]

        def held(*args: object) -> object:
            calls[0] += 1
            if calls[0] == ARMED + 1:  # after this call's agreement step, before its transfer
                time.sleep(HOLD)
            return original(*args)

        transport.allreduce_now = held
    x = np.zeros(elements, np.float64)
    y = np.zeros(elements, np.float64)
    stacked = np.zeros((size, elements), np.float64)  # an allgather's output, a reduce-scatter's input
    interrupted, ended = None, None
    for call in range(CALLS):
        x[:] = call * 100 + rank + 1
        y[:] = -1.0
        expected = size * call * 100 + size * (size + 1) / 2
        if call == ARMED:
            if rank == 0:
                signal.setitimer(signal.ITIMER_REAL, random.uniform(0.1, HOLD - 0.2))
            elif wait == "agreement":
                time.sleep(HOLD)
        try:
            if form == "allgather":
                stacked[:] = -1.0
                comm.allgather(x, out=stacked)
            elif form == "reduce_scatter":
                stacked[:] = x
                comm.reduce_scatter(stacked, out=y)
            else:
                comm.allreduce(x) if form == "inplace" else comm.allreduce(x, out=y)
        except KeyboardInterrupt:
            interrupted = call
            continue
        except (denseccl.CommunicatorBrokenError, denseccl.CollectiveTimeoutError) as error:
            ended = (call, type(error).__name__)
            break
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        if form == "allgather":
            blocks = [call * 100 + r + 1 for r in range(size)]
            check.check(np.array_equal(stacked[:, 0], blocks) and bool(np.all(stacked == stacked[:, :1])),
                        f"call {call}: gathered {stacked[:, 0]}, not every rank's input of this call {blocks}")
            continue
        result = x if form == "inplace" else y
        check.check(np.all(result == expected), f"call {call}: got {result[0]}, every rank's inputs sum to {expected}")
    if rank == 0:
        check.check(interrupted == ARMED, f"the victim was interrupted at call {interrupted}, not {ARMED}")
        check.check(ended == (ARMED + 1, "CommunicatorBrokenError"),
                    f"after the interrupt the victim's next call ended {ended}, not with CommunicatorBrokenError")
    else:
        check.check(ended is not None and ended[0] <= ARMED + 1, f"a peer of the interrupted rank ended {ended}")
    check.check(comm.flow.broken is not None, "the communicator is not marked broken")
    print(f"rank {rank}: interrupted {interrupted}, ended {ended}", flush=True)
    # no rank leaves before every rank has reported (a file each in INTERRUPT_DIR): a rank that
    # ends without MPI_Finalize may make mpiexec end the whole job, peers' reports unprinted
    check.finish(hard_exit=True, before_exit=lambda: reported(rank, size, os.environ["INTERRUPT_DIR"]))


def reported(rank: int, size: int, folder: str) -> None:
    """Say this rank has reported, then wait (at most a minute) until every rank has, and a
    moment more for the launcher to pass the last lines on."""
    open(os.path.join(folder, str(rank)), "w").close()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(os.listdir(folder)) < size:
        time.sleep(0.05)
    time.sleep(0.3)


if __name__ == "__main__":
    main()
