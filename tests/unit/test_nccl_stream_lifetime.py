"""A stream object handed to a collective of CUDA torch tensors lives as long as the tensors
recorded on it: torch's caching allocator records an event on every stream a tensor was
recorded on when its storage is freed, which fails ("invalid resource handle") on a stream
destroyed before (a CuPy stream the caller let go once the call returned)."""

from __future__ import annotations

import gc
import weakref

import numpy as np

from tests.unit.test_nccl_graphs_and_threads import SimpleStream, _FakeTensor, solo, torch_like  # noqa: F401


class _Storage:
    """Stands for a tensor's untyped storage, shared by its views."""


class _StoredTensor(_FakeTensor):
    def __init__(self, array, storage):
        super().__init__(array)
        self.storage = storage

    def untyped_storage(self):
        return self.storage


def test_a_given_stream_lives_as_long_as_the_storage(torch_like):  # noqa: F811
    storage = _Storage()
    x = _StoredTensor(np.ones(6, np.float32), storage)
    view = _StoredTensor(x.array, storage)  # another tensor on the same memory
    stream = SimpleStream(66)
    alive = weakref.ref(stream)
    torch_like.allreduce(x, stream=stream)
    torch_like.allreduce(x, stream=stream)  # a second call on the same stream pins it once
    assert x.recorded == [66, 66]
    del stream
    gc.collect()
    assert alive() is not None  # the caller let it go; torch may still record an event on it
    del x, storage
    gc.collect()
    assert alive() is not None  # the view still holds the memory
    del view
    gc.collect()
    assert alive() is None  # the memory is freed: nothing holds the stream any more


def test_a_bare_handle_pins_nothing(torch_like):  # noqa: F811
    storage = _Storage()
    x = _StoredTensor(np.ones(6, np.float32), storage)
    torch_like.allreduce(x, stream=66)
    assert x.recorded == [66]
    from denseccl import streams

    assert storage not in streams._PINNED
