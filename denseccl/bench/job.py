"""What every contender of one benchmark run shares: the MPI job, and lazily created
communicators (denseccl, torch.distributed groups, raw NCCL) that all ranks create together."""

from __future__ import annotations

import datetime
import os
import socket
from typing import Any, Dict, Optional, Tuple

from .. import config


#: calls the bench's recorded communicators keep unless DENSECCL_TRACE_BUFFER says
RECORDED = "1024"


class Job:
    """The ranks of this run. Every lazily created communicator is created in the same order
    on every rank (contenders are set up in one fixed order), as collectives require."""

    def __init__(self, backend: str) -> None:
        from mpi4py import MPI  # noqa: PLC0415 - the bench always runs under mpiexec

        self.MPI = MPI
        self.world = MPI.COMM_WORLD.Dup()
        self.rank: int = self.world.Get_rank()
        self.size: int = self.world.Get_size()
        self.backend = backend
        self._denseccl: Dict[Tuple[bool, bool], Any] = {}
        self._torch_groups: Dict[str, Any] = {}
        self._torch_ready = False
        self._nccl: Optional[Any] = None
        self._cupyx: Optional[Any] = None
        local = config.local_rank()
        self.local_rank = self.rank if local is None else local

    def denseccl(self, check: bool, recorder: bool = False) -> Any:
        """denseccl's communicator with the agreement ``check`` on or off, with a flight
        recorder (of ``DENSECCL_TRACE_BUFFER`` calls, else :data:`RECORDED`) or without."""
        comm = self._denseccl.get((check, recorder))
        if comm is None:
            import denseccl  # noqa: PLC0415

            saved = os.environ.get("DENSECCL_TRACE_BUFFER")
            calls = saved if saved and saved.strip() not in ("", "0") else RECORDED
            os.environ["DENSECCL_TRACE_BUFFER"] = calls if recorder else "0"
            try:
                comm = denseccl.init(self.backend, check="always" if check else "off")
            finally:
                if saved is None:
                    os.environ.pop("DENSECCL_TRACE_BUFFER", None)
                else:
                    os.environ["DENSECCL_TRACE_BUFFER"] = saved
            self._denseccl[(check, recorder)] = comm
        return comm

    def torch_group(self, backend: str) -> Any:
        """A torch.distributed group of all ranks with ``backend`` ("gloo", "nccl",
        "denseccl"). The default group is gloo; its rendezvous is a TCPStore that rank 0 opens
        on a free port of its host, told to the others over MPI: loopback when every rank shares
        rank 0's host, rank 0's host name otherwise (``GLOO_SOCKET_IFNAME`` picks gloo's
        interface, as usual)."""
        import torch.distributed as dist  # noqa: PLC0415

        if not self._torch_ready:
            hosts = self.world.allgather(socket.gethostname())
            one_host = len(set(hosts)) == 1
            address = "127.0.0.1" if one_host else hosts[0]
            wait = datetime.timedelta(seconds=120)
            store = None
            if self.rank == 0:
                store = dist.TCPStore(address, 0, self.size, is_master=True, timeout=wait, wait_for_workers=False)
            port = self.world.bcast(store.port if store is not None else None, root=0)
            if store is None:
                store = dist.TCPStore(address, port, self.size, is_master=False, timeout=wait)
            if one_host:
                os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
            dist.init_process_group("gloo", store=store, rank=self.rank, world_size=self.size, timeout=wait)
            self._torch_ready = True
        group = self._torch_groups.get(backend)
        if group is None:
            if backend == "denseccl":
                import denseccl.torch  # noqa: F401, PLC0415 - registers the backend
            group = dist.group.WORLD if backend == "gloo" else dist.new_group(backend=backend)
            self._torch_groups[backend] = group
        return group

    def nccl(self) -> Any:
        """A cupy.cuda.nccl communicator of all ranks (unique id broadcast over MPI)."""
        if self._nccl is None:
            from cupy.cuda import nccl  # noqa: PLC0415

            uid = nccl.get_unique_id() if self.rank == 0 else None
            uid = self.world.bcast(uid, root=0)
            self._nccl = nccl.NcclCommunicator(self.size, uid, self.rank)
        return self._nccl

    def cupyx(self) -> Any:
        if self._cupyx is None:
            import cupyx.distributed  # noqa: PLC0415

            self._cupyx = cupyx.distributed.init_process_group(self.size, self.rank, use_mpi=True)
        return self._cupyx

    def any(self, flag: bool) -> bool:
        return bool(self.world.allreduce(int(bool(flag)), op=self.MPI.MAX))

    def close(self) -> None:
        for comm in self._denseccl.values():
            comm.close()
        if self._torch_ready:
            import torch.distributed as dist  # noqa: PLC0415

            dist.destroy_process_group()
