"""A torch key-value store that counts the operations made through it (the board's promise:
after a communicator is created, a call makes no store operation at all).

It is a ``torch.distributed.Store`` subclass, so that torch's own code (``PrefixStore``, gloo's
rendezvous, ``init_process_group(store=...)``) can use it, and forwards every operation to the
store it wraps (a ``TCPStore``)."""

from __future__ import annotations

import os
import threading
from datetime import timedelta
from typing import Any, List

import torch.distributed as dist


class CountingStore(dist.Store):
    """``inner`` with a count of every operation (``ops``)."""

    def __init__(self, inner: Any) -> None:
        super().__init__()
        self.inner = inner
        self.ops = 0
        self._lock = threading.Lock()

    def _count(self) -> None:
        with self._lock:
            self.ops += 1

    def set(self, key: str, value: Any) -> None:
        self._count()
        self.inner.set(key, value)

    def get(self, key: str) -> bytes:
        self._count()
        return self.inner.get(key)

    def add(self, key: str, amount: int) -> int:
        self._count()
        return self.inner.add(key, amount)

    def check(self, keys: List[str]) -> bool:
        self._count()
        return self.inner.check(keys)

    def wait(self, keys: List[str], timeout: Any = None) -> None:
        self._count()
        if timeout is None:
            self.inner.wait(keys)
        else:
            self.inner.wait(keys, timeout)

    def delete_key(self, key: str) -> bool:
        self._count()
        return self.inner.delete_key(key)

    def multi_get(self, keys: List[str]) -> List[bytes]:
        self._count()
        return self.inner.multi_get(keys)

    def multi_set(self, keys: List[str], values: List[Any]) -> None:
        self._count()
        self.inner.multi_set(keys, values)

    def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
        self._count()
        return self.inner.compare_set(key, expected, desired)

    def num_keys(self) -> int:
        self._count()
        return self.inner.num_keys()

    def set_timeout(self, timeout: timedelta) -> None:
        self.inner.set_timeout(timeout)

    @property
    def timeout(self) -> timedelta:
        return self.inner.timeout


def env_counting_store(rank: int, size: int, seconds: float = 60) -> CountingStore:
    """A counting store over the ``TCPStore`` at ``MASTER_ADDR:MASTER_PORT`` (torchrun's agent
    serves it when ``TORCHELASTIC_USE_AGENT_STORE`` is set; rank 0 otherwise)."""
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    inner = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), size, rank == 0 and not agent,
        timeout=timedelta(seconds=seconds), wait_for_workers=False,
    )
    return CountingStore(inner)
