"""The shared-memory engine's pieces without ranks (backends/shm): its setting, the data area's
size, which calls fit, and the slots it lays over the area. Its calls on threads:
tests/unit/test_shm_threads.py; on real ranks: tests/torch/test_host_path.py."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from denseccl import config  # noqa: E402
from denseccl.backends.shm.area import ALIGN, Area, area_bytes, average, slot_bytes  # noqa: E402
from denseccl.backends.shm.transport import ShmTransport  # noqa: E402
from denseccl.channel.board import Board, page_bytes  # noqa: E402
from denseccl.dtypes import DTYPES  # noqa: E402
from denseccl.errors import DenseCCLError  # noqa: E402
from denseccl.ops import PreMulSum, ReduceOp  # noqa: E402

from .shm_threads import Refused  # noqa: E402


def test_the_setting() -> None:
    assert config.settings({}).host_path == config.DEFAULT_HOST_PATH == 65536
    assert config.settings({"DENSECCL_HOST_PATH": "0"}).host_path == 0
    assert config.settings({"DENSECCL_HOST_PATH": "4096"}).host_path == 4096
    with pytest.raises(DenseCCLError, match="DENSECCL_HOST_PATH must be a whole number"):
        config.settings({"DENSECCL_HOST_PATH": "64K"})


def test_slots_are_whole_cache_lines_two_per_rank() -> None:
    assert slot_bytes(1) == ALIGN and slot_bytes(64) == 64 and slot_bytes(65) == 128
    assert area_bytes(65536, 4) == 2 * 4 * 65536


def board_with_area(limit: int, size: int = 3, rank: int = 1) -> Board:
    return Board(bytearray(page_bytes(size)), rank, size, data=memoryview(bytearray(area_bytes(limit, size))))


def test_what_fits() -> None:
    host = ShmTransport(board_with_area(100), 100, Refused(3))
    u8, f32, u16 = DTYPES["uint8"], DTYPES["float32"], DTYPES["uint16"]
    assert host.fits("allreduce", 100, u8) and host.fits("reduce", 2, f32) and host.fits("broadcast", 1, u8)
    assert not host.fits("allreduce", 101, u8) and not host.fits("allreduce", 0, u8)
    assert not host.fits("allreduce", 26, f32)
    assert host.fits("allgather", 100, u8) and not host.fits("allgather", 101, u8)
    assert host.fits("allgather", 50, u16) and not host.fits("allreduce", 1, u16)  # gathered as bytes, not reduced
    assert host.fits("reduce_scatter", 33, u8) and not host.fits("reduce_scatter", 34, u8)  # the whole input: 3 blocks
    assert host.fits("barrier", 0, None)
    assert not host.fits("allreduce", 4, f32, PreMulSum(0.5)) and host.fits("allreduce", 4, f32, ReduceOp.AVG)


def test_each_slot_is_its_own_memory_in_the_area() -> None:
    board = board_with_area(100)
    slots = Area(board.data, 3, 100).slots(25, torch.float32)  # type: ignore[arg-type]
    assert [len(row) for row in slots] == [3, 3]
    for parity in (0, 1):
        for rank in range(3):
            slots[parity][rank].fill_(parity * 10 + rank + 1)
    area = torch.frombuffer(board.data, dtype=torch.float32)  # type: ignore[arg-type]
    per_slot = slot_bytes(100) // 4
    for parity in (0, 1):
        for rank in range(3):
            start = (parity * 3 + rank) * per_slot
            assert torch.equal(area[start : start + 25], torch.full((25,), float(parity * 10 + rank + 1)))


def test_the_parity_follows_the_next_step() -> None:
    board = Board(bytearray(page_bytes(1)), 0, 1)  # one rank: its steps return at once
    parities = []
    for _ in range(4):
        parities.append(board.parity())
        board.all_equal(7, False, None)
    assert parities == [1, 0, 1, 0]


def test_average_truncates_integers_as_gloo_does() -> None:
    ints = torch.tensor([7, -7, 5])
    average(ints, 2)
    assert ints.tolist() == [3, -3, 2]
    floats = torch.tensor([7.0, -7.0])
    average(floats, 2)
    assert floats.tolist() == [3.5, -3.5]
