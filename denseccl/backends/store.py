"""A host control channel over a key-value store (torch's ``TCPStore``, or anything with its
``set`` / ``wait`` / ``get`` / ``check`` / ``delete_key`` methods).

It carries the agreement step (docs/design.md) where there is no MPI: under a torchrun-style launch
and in the torch adapter. Each exchange is one sequence number: every rank sets
``{prefix}/{seq}/{rank}``, waits until all ``size`` keys exist (up to the deadline, then
:class:`CollectiveTimeoutError`) and reads them. A rank that has read all keys of ``seq`` knows
that every rank has finished reading ``seq - 1``, so it then deletes its own key of ``seq - 1``:
the store holds at most two exchanges' keys per rank.

The store itself is not imported here; :func:`tcp_store` makes a torch ``TCPStore``, lazily.
"""

from __future__ import annotations

import struct
import time
from datetime import timedelta
from typing import Any, Callable, List, Optional, Sequence

from .. import config, log
from ..channel.shared import open_shared
from ..errors import DenseCCLError, peer_gave_up_error, timeout_error
from ..channel.base import ControlChannel, StoreNews
from ..transport import is_timeout, split_members

_MARK = b"\x01"  # stores may treat an empty value oddly; every value carries one leading byte


def wait_for_keys(
    store: Any, keys: List[str], deadline: Optional[float], what: str, watch: Optional[Callable[[], None]] = None
) -> None:
    """Block until every key exists; :class:`CollectiveTimeoutError` once ``deadline`` (a
    ``time.monotonic()`` value, None for never) has passed. ``watch``: called every
    :data:`config.WATCH_SECONDS` of the wait, raises if it is hopeless (a peer gave up)."""
    piece = config.STORE_WAIT_SLICE if watch is None else config.WATCH_SECONDS
    while True:
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            if store.check(keys):
                return
            missing = [k for k in keys if not store.check([k])]
            shown = ", ".join(missing[:8]) + (" …" if len(missing) > 8 else "")
            raise timeout_error(what, f"missing store keys {shown}")
        span = piece if remaining is None else min(remaining, piece)
        try:
            store.wait(keys, timedelta(seconds=max(span, 0.001)))
            return
        except Exception as error:
            # torch's stores report a wait that ran out as a DistStoreError, whatever its message
            if type(error).__name__ != "DistStoreError" and not is_timeout(error):
                raise
        if watch is not None:
            watch()


class StoreControl(ControlChannel):
    """Agreement traffic through a key-value store, under ``prefix``."""

    def __init__(self, store: Any, rank: int, size: int, prefix: str = "denseccl/control") -> None:
        if not 0 <= rank < size:
            raise DenseCCLError(f"rank {rank} is not in 0..{size - 1}")
        self.store = store
        self.rank = rank
        self.size = size
        self.prefix = prefix.rstrip("/")
        self._sequence = 0
        self._splits = 0
        self._multi_get = getattr(store, "multi_get", None)
        self._news = StoreNews(store, f"{self.prefix}/gave_up", size)

    def __repr__(self) -> str:
        return f"<StoreControl {self.prefix} rank {self.rank} of {self.size}>"

    def path(self) -> str:
        return f"key-value store: set, wait, get and delete per call ({self.size} ranks)"

    def _key(self, sequence: int, rank: int) -> str:
        return f"{self.prefix}/{sequence}/{rank}"

    def _exchange(self, data: bytes, deadline: Optional[float]) -> List[bytes]:
        sequence = self._sequence
        self._sequence += 1
        keys = [self._key(sequence, r) for r in range(self.size)]
        self.store.set(keys[self.rank], _MARK + bytes(data))
        wait_for_keys(self.store, keys, deadline, "the agreement step", self._watch)
        values = self._multi_get(keys) if self._multi_get is not None else [self.store.get(k) for k in keys]
        if sequence:
            # Every rank has set its key of `sequence`, so all have read `sequence - 1`.
            self.store.delete_key(self._key(sequence - 1, self.rank))
        return [bytes(v)[1:] for v in values]

    def allreduce_max(self, values: Sequence[int], deadline: Optional[float]) -> Sequence[int]:
        n = len(values)
        rows = [struct.unpack(f"<{n}q", raw) for raw in self._exchange(struct.pack(f"<{n}q", *values), deadline)]
        return [max(column) for column in zip(*rows)]

    def allgather_bytes(self, data: bytes, deadline: Optional[float]) -> Sequence[bytes]:
        return self._exchange(data, deadline)

    def split(self, color: Optional[int], key: int, deadline: Optional[float]) -> Optional["StoreControl"]:
        """Members of each color ranked by ``(key, rank)``, as MPI and NCCL rank them."""
        index = self._splits
        self._splits += 1
        mine = struct.pack("<qq", -1 if color is None else color, key)
        entries = [struct.unpack("<qq", raw) for raw in self._exchange(mine, deadline)]
        if color is None:
            return None
        members = split_members(entries, color)
        prefix = f"{self.prefix}/split{index}/color{color}"
        return StoreControl(self.store, members.index(self.rank), len(members), prefix)

    def _watch(self) -> None:
        who = self._news.heard()
        if who is not None:
            raise peer_gave_up_error(who)

    def give_up(self) -> None:
        self._news.tell(self.rank)

    def peer_gave_up(self) -> Optional[int]:
        return self._news.heard()

    def close(self) -> None:
        """Forget the store. It is never shut down here: torch's process group may share it,
        and this rank's last key may still be read by a slower peer."""
        self.store = None


class SoloControl(ControlChannel):
    """The control channel of a one-rank communicator: nothing to exchange."""

    rank = 0
    size = 1

    def allreduce_max(self, values: Sequence[int], deadline: Optional[float]) -> Sequence[int]:
        return list(values)

    def allgather_bytes(self, data: bytes, deadline: Optional[float]) -> Sequence[bytes]:
        return [bytes(data)]

    def split(self, color: Optional[int], key: int, deadline: Optional[float]) -> Optional["SoloControl"]:
        return None if color is None else SoloControl()


def tcp_store(
    host: str,
    port: int,
    rank: int,
    size: int,
    *,
    is_master: Optional[bool] = None,
    timeout: float = config.DEFAULT_TIMEOUT,
) -> Any:
    """A torch ``TCPStore`` client (and, on rank 0 unless ``is_master`` says otherwise, the
    server) at ``host:port``. torch is imported only here."""
    try:
        from torch.distributed import TCPStore  # noqa: PLC0415 - optional dependency
    except ImportError as error:
        raise DenseCCLError(
            f"a torchrun-style launch (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) needs torch's TCPStore to "
            f"exchange the NCCL unique id ({error}); install torch, or launch with mpiexec "
            "(pip install 'denseccl[mpi]')"
        ) from None
    master = rank == 0 if is_master is None else is_master
    return TCPStore(host, int(port), size, master, timeout=timedelta(seconds=timeout), wait_for_workers=False)


def gloo_leaders(inner: ControlChannel, leader: bool, deadline: Optional[float]) -> Optional[ControlChannel]:
    """The leaders' channel of a store channel (the NCCL path): a gloo group of the leaders on
    the store where torch has gloo, so that no call makes a store operation; else the store
    channel's own split (and a log line saying that the leaders' round goes through the store)."""
    part = inner.split(0 if leader else None, 0, deadline)
    store, prefix = getattr(part, "store", None), getattr(part, "prefix", "")
    if part is None or store is None:
        return part
    try:
        from torch.distributed import Store  # noqa: PLC0415 - optional

        from .gloo.transport import GlooControl, make_group  # noqa: PLC0415 - needs torch
    except ImportError:
        log.info("agreement step: the hosts' leaders agree through the store (torch's gloo is not available)")
        return part
    if not isinstance(store, Store):
        log.info("agreement step: the hosts' leaders agree through the store (not a torch store: no gloo group)")
        return part
    group = make_group(store, f"{prefix}/gloo/", part.rank, part.size, None, "the leaders' group", deadline)
    part.close()
    return GlooControl(group, store, f"{prefix}/gloo/", None)


def open_store_control(store: Any, rank: int, size: int, prefix: str, deadline: Optional[float]) -> ControlChannel:
    """The control channel of ``size`` ranks meeting on the key-value ``store`` (the NCCL path
    under a store launch; collective): boards per host and gloo among the leaders where they can
    be made (:func:`open_shared`), else a ``StoreControl`` under ``prefix``."""
    return open_shared(StoreControl(store, rank, size, prefix), deadline, gloo_leaders)


__all__ = [
    "SoloControl", "StoreControl", "gloo_leaders", "open_store_control", "tcp_store", "wait_for_keys",
]
