"""Driver (not a rank): start ``mpiexec -n N python busy.py`` in its own process group, then
either SIGKILL the whole job once every rank is ready or let it finish; print what /dev/shm
held while it ran and what it holds after, as JSON lines "RUNNING: [...]" and "LEFT: [...]".
Meant to run in a private mount namespace with its own tmpfs on /dev/shm (test_shared_page.py).

usage: python kill_job.py MPIEXEC NRANKS kill|finish
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from tests.support.ranks import launch
from tests.support.segments import kill_session

mpiexec, nranks, how = sys.argv[1], int(sys.argv[2]), sys.argv[3]
busy = Path(__file__).with_name("busy.py")
start, needs = launch(mpiexec, nranks)
job = subprocess.Popen(
    [*start, sys.executable, str(busy), "0" if how == "kill" else "2000"],
    stdout=subprocess.PIPE, text=True, start_new_session=True, env={**os.environ, **needs},
)
ready = 0
deadline = time.monotonic() + 90
try:
    while ready < nranks and time.monotonic() < deadline:
        line = job.stdout.readline()  # type: ignore[union-attr]
        if not line:
            break
        ready += line.count("ready")  # lines of several ranks may run together
    print("RUNNING: " + json.dumps(sorted(os.listdir("/dev/shm"))), flush=True)
    if how == "kill":  # every process of the job: launcher and ranks
        kill_session(job.pid)
    job.wait(timeout=60)
    print(job.stdout.read(), flush=True)  # type: ignore[union-attr] - the ranks' summaries, if they finished
    time.sleep(0.5)  # the ranks are not our children: let the kernel finish them
finally:
    kill_session(job.pid)
    job.wait()
print(f"READY: {ready}", flush=True)
print("LEFT: " + json.dumps(sorted(os.listdir("/dev/shm"))), flush=True)
