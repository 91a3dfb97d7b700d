"""Two ranks of one host on one GPU (``torchrun --nproc-per-node 2`` on a one-GPU machine) are
found before NCCL is touched, on every rank, with one error that says what to do; NCCL's own
refusal never reaches the user as a bare NcclError; the install advice names the extra for the
CUDA this machine runs."""

from __future__ import annotations

import sys
import threading
import types
from datetime import timedelta

import pytest

import denseccl
from denseccl.backends.nccl import advice, placement
from denseccl.backends.nccl import init as nccl_bootstrap
from denseccl.errors import DenseCCLError
from tests.unit.test_nccl_bootstrap import _fake_cupy
from tests.unit.test_nccl_bootstrap_flow import fakes, torch_distributed, waiting_policy  # noqa: F401 - fixtures
from tests.unit.test_nccl_fakes import NcclError

RAW = bytes(range(128))


def _ranks(size, body):
    """``body(rank)`` in a thread per rank: each rank's result or exception."""
    outcomes = [None] * size

    def run(rank):
        try:
            outcomes[rank] = body(rank)
        except BaseException as error:  # noqa: BLE001
            outcomes[rank] = error

    threads = [threading.Thread(target=run, args=(r,)) for r in range(size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return outcomes


@pytest.mark.parametrize("devices, sharing", [((None, None, None), [0, 1, 2]), ((0, 1, 0), [0, 2])])
def test_ranks_sharing_a_gpu_all_raise_before_nccl(fakes, torch_distributed, monkeypatch, devices, sharing):  # noqa: F811
    """One visible GPU, three ranks: each would pick device 0 (``None``: the default choice);
    or two of three given device 0 explicitly. Every rank, the one with a GPU of its own too,
    raises the same error and no communicator is ever made."""
    monkeypatch.setattr(nccl_bootstrap, "device_identity", placement.device_identity)  # one host: the process's
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.delenv("NCCL_HOSTID", raising=False)
    cupy, nccl = nccl_bootstrap._require_nccl()
    one_gpu = types.SimpleNamespace(**vars(cupy))
    runtime = types.SimpleNamespace(getDeviceCount=lambda: 1)
    one_gpu.cuda = types.SimpleNamespace(**{**vars(cupy.cuda), "runtime": runtime})
    monkeypatch.setattr(nccl_bootstrap, "_require_nccl", lambda: (one_gpu, nccl))
    server = torch_distributed.TCPStore("127.0.0.1", 0, 4, True, timeout=timedelta(seconds=30), wait_for_workers=False)

    def body(rank):
        store = torch_distributed.TCPStore("127.0.0.1", server.port, 4, False, timeout=timedelta(seconds=30))
        return denseccl.init(backend="nccl", store=store, rank=rank, size=3, device=devices[rank], timeout=20)

    outcomes = _ranks(3, body)
    assert all(isinstance(o, DenseCCLError) for o in outcomes), outcomes
    assert len({str(o) for o in outcomes}) == 1  # the same error on every rank
    text = str(outcomes[0])
    assert f"ranks {', '.join(map(str, sharing))} on host" in text and "device 0" in text and "PCI 0000:18:00.0" in text
    for advice_part in ("one rank per GPU", "--nproc-per-node", "CUDA_VISIBLE_DEVICES", "NCCL_HOSTID", "instead of 3"):
        assert advice_part in text, text
    assert fakes.made == []  # NCCL was never asked


def test_distinct_gpus_and_distinct_host_ids_pass():
    def identity(host_id, bus, ordinal=0):
        return f"{placement.host_identity({'NCCL_HOSTID': host_id})}|{bus}|{ordinal}".encode()

    # one GPU, two NCCL hosts (the tests' sockets trick): NCCL connects them, so no refusal here
    assert placement.shared_devices([identity("a", "0000:18:00.0"), identity("b", "0000:18:00.0")]) == []
    # one host, two GPUs
    assert placement.shared_devices([identity("a", "0000:18:00.0"), identity("a", "0000:19:00.0", 1)]) == []
    # one host, one GPU, ranks 0 and 2 (the ordinal is the first rank's)
    shared = placement.shared_devices(
        [identity("a", "0000:18:00.0"), identity("a", "0000:19:00.0", 1), identity("a", "0000:18:00.0", 0)]
    )
    assert shared == [("NCCL_HOSTID=a", "0000:18:00.0", 0, [0, 2])]


def test_host_identity_is_nccls(tmp_path):
    boot = tmp_path / "boot_id"
    boot.write_text("1234-abcd\n")
    import socket

    assert placement.host_identity({}, str(boot)) == f"{socket.gethostname()}/1234-abcd"
    assert placement.host_identity({"NCCL_HOSTID": "h7"}, str(boot)) == "NCCL_HOSTID=h7"
    assert placement.host_identity({}, str(tmp_path / "missing")) == socket.gethostname()


@pytest.mark.parametrize("status, says", [(5, "one rank per GPU"), (2, "NCCL_SOCKET_IFNAME"), (3, "same NCCL")])
def test_nccl_init_errors_are_explained(status, says):
    """NCCL's refusal (a CuPy NcclError with .status) is never raised bare."""

    def refuses(ndev, commId, rank):
        raise NcclError(status)

    with pytest.raises(DenseCCLError) as raised:
        nccl_bootstrap.make_communicator(refuses, 2, RAW, 1, "14.2.0")
    text = str(raised.value)
    assert "rank 1 of 2" in text and "NCCL_DEBUG=WARN" in text and says in text, text
    assert isinstance(raised.value.__cause__, NcclError)


def test_other_errors_pass_unchanged():
    def broken(ndev, commId, rank):
        raise ValueError("not NCCL's")

    with pytest.raises(ValueError, match="not NCCL's"):
        nccl_bootstrap.make_communicator(broken, 2, RAW, 0, "14.2.0")


@pytest.mark.parametrize("major", [12, 13])
def test_install_advice_names_this_machines_cuda(monkeypatch, major):
    """CuPy's runtime says CUDA ``major`` (no torch loaded, or a CPU torch): the advice names that
    extra and that NCCL wheel only; installing the other CuPy beside it would break CuPy."""
    _fake_cupy(monkeypatch, gpu=True, nccl_available=False)
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    sys.modules["cupy.cuda"].runtime = types.SimpleNamespace(runtimeGetVersion=lambda: major * 1000 + 20)
    monkeypatch.setitem(sys.modules, "cupy.cuda.runtime", sys.modules["cupy.cuda"].runtime)
    other = 25 - major
    message = nccl_bootstrap.nccl_missing()
    assert f"nvidia-nccl-cu{major}" in message and f"nvidia-nccl-cu{other}" not in message, message
    assert advice.install_hint().startswith(f"pip install 'denseccl[cuda{major}]'")
    assert f"denseccl[cuda{other}]" not in advice.install_hint()


def test_torch_build_decides_over_cupy(monkeypatch):
    """torch 2.11 (cu130) is loaded: its CUDA decides, whatever CuPy was installed beside it."""
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(version=types.SimpleNamespace(cuda="13.0")))
    assert advice.cuda_major() == 13 and "denseccl[cuda13]" in advice.install_hint()
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(version=types.SimpleNamespace(cuda=None)))
    monkeypatch.setattr(advice, "_cupy_runtime", lambda: None)
    monkeypatch.setattr(advice, "_driver", lambda: None)
    assert advice.cuda_major() is None and "cuda12" in advice.install_hint() and "cuda13" in advice.install_hint()
