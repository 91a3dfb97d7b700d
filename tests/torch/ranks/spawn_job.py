"""The torchrun job (torchrun_job.py) under torch.multiprocessing.spawn with an explicit
init_method: ``python spawn_job.py N file|tcp|env``. Each rank prints its checker's summary."""

from __future__ import annotations

import os
import socket
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from tests.support.checker import Checker
from torchrun_job import job

import denseccl.torch as dt


def worker(rank: int, size: int, init_method: str) -> None:
    torch.set_num_threads(1)
    if init_method == "env://":
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(size))
        dt.init_process_group("denseccl", timeout=60)  # seconds, as torch users also pass a timedelta
    else:
        dist.init_process_group("denseccl", init_method=init_method, rank=rank, world_size=size)
    check = Checker("torch-spawn", rank, size)
    job(check)
    dist.destroy_process_group()
    check.done()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    size, kind = int(sys.argv[1]), sys.argv[2]
    with tempfile.TemporaryDirectory() as directory:
        if kind == "file":
            init_method = f"file://{directory}/rendezvous"
        elif kind == "tcp":
            init_method = f"tcp://127.0.0.1:{free_port()}"
        else:
            os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
            init_method = "env://"
        mp.spawn(worker, args=(size, init_method), nprocs=size, join=True)
