"""Probes of the GPU behaviour the CPU tests can only model with fakes: what the real CUDA,
NCCL, CuPy and torch do where denseccl's close(), capture gate and default-stream handling rely
on them. One rank, one GPU; tests/gpu/run.sh runs each probe in its own process (a crash or
hang in one hides nothing of the others).

usage: python tests/gpu/probe.py NAME [NAME...]
  names: destroy (does ncclCommDestroy wait for one rank's calls: none, a copy, a kernel?), close
  (timeout 2 s, a blocked stream), close_untimed (no timeout), capture (a global-mode capture after a dropped Work,
  CuPy and torch), freed_stream (a capture stream destroyed after its capture),
  default_stream (torch's stream for handle 0), stream_lifetime (a CuPy stream given for a torch
  tensor and let go before the tensor is freed)

Prints "PASS probe NAME: ...", "FAIL probe NAME: ..." or "INFO probe NAME: ..." lines, the
facts each probe measured included; exits 1 if any probe failed.
"""

from __future__ import annotations

import gc
import logging
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Dict, List

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

import denseccl  # noqa: E402
from tests.gpu.support import cupy_from_host, cupy_to_host, torch_cuda  # noqa: E402

GATE = 8.0  # seconds a host function blocks a stream: a stand-in for a peer that never comes
RESULTS: List[str] = []
#: what the probes put in flight: with one rank NCCL enqueues a kernel for a PreMulSum (onerank.cu)
#: but nothing for an in-place sum, which would leave only denseccl's own event to test
IN_FLIGHT = denseccl.PreMulSum(2.0)


def report(outcome: str, name: str, text: str) -> None:
    line = f"{outcome} probe {name}: {text}"
    RESULTS.append(line)
    print(line, flush=True)


def one_rank(timeout: float) -> Any:
    return denseccl.init(backend="nccl", size=1, timeout=timeout)


def blocked_stream(seconds: float) -> Any:
    """A non-blocking CuPy stream whose work waits behind a host function for ``seconds``
    (or until the returned gate is set): (stream, gate)."""
    import cupy

    stream = cupy.cuda.Stream(non_blocking=True)
    gate = threading.Event()
    stream.launch_host_func(lambda opened: opened.wait(seconds), gate)
    return stream, gate


class Warnings(logging.Handler):
    """The denseccl warnings, with when they came (seconds after ``started``)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.started = time.monotonic()
        self.seen: List[str] = []
        logging.getLogger("denseccl").addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append(f"at {time.monotonic() - self.started:.1f} s: {record.getMessage()[:160]}")

    def close(self) -> None:
        logging.getLogger("denseccl").removeHandler(self)
        super().close()


def _failure_time(transport: Any, started: float, found: Dict[str, float], stop: threading.Event) -> None:
    while not stop.is_set():
        if transport.failure() is not None:
            found["at"] = time.monotonic() - started
            return
        time.sleep(0.01)


# -- 1. close() with work in flight ------------------------------------------------------------


def destroy() -> None:
    """Does ncclCommDestroy wait for work of its communicator? With one rank NCCL plans nothing:
    an in-place sum enqueues nothing, an out-of-place one a copy and a PreMulSum a kernel, all on
    the caller's stream (onerank.cu), while destroy synchronizes only NCCL's own streams; so the
    source predicts it waits for none of the three. (A two-rank kernel is behind NCCL's device
    stream: the two-rank faults test covers that.) Each variant has its own communicator, whose
    library handle is destroyed directly, with the call behind a 4 s host function."""
    seen = []
    for variant in ("in place, sum", "out of place, sum", "in place, PreMulSum(2)"):
        comm = one_rank(30.0)
        x = cupy_from_host(np.ones(1 << 12, np.float32))
        out = cupy_from_host(np.zeros(1 << 12, np.float32))
        stream, gate = blocked_stream(4.0)
        if variant.startswith("out"):
            comm.allreduce(x, out=out, stream=stream)
        else:
            comm.allreduce(x, denseccl.PreMulSum(2.0) if "PreMul" in variant else "sum", stream=stream)
        started = time.monotonic()
        try:
            comm.transport.comm.destroy()  # ncclCommDestroy itself, not denseccl's close
        except Exception as error:  # noqa: BLE001 - said in the line
            seen.append(f"{variant}: destroy raised {type(error).__name__}: {error}")
        took = time.monotonic() - started
        gate.set()
        stream.synchronize()
        value = float(cupy_to_host(out if variant.startswith("out") else x)[0])
        seen.append(f"{variant}: {took:.2f} s, then {value:g}")
    report("INFO", "destroy", "ncclCommDestroy with one rank's call behind a 4 s host function (> 3 s: it waited): "
           + "; ".join(seen))  # fmt: skip


def close() -> None:
    """close() with timeout 2 s and a kernel that cannot run for GATE s: the abort comes at
    about 2 s (the watchdog's or close's), not when the kernel ends; close itself returns when
    ncclCommAbort returns, which frees device memory and so may wait for the host function."""
    comm = one_rank(2.0)
    x = cupy_from_host(np.ones(1 << 12, np.float32))  # before the block: the copy synchronizes
    stream, gate = blocked_stream(GATE)
    comm.allreduce(x, IN_FLIGHT, stream=stream)  # a kernel in flight, not an empty one-rank call
    watch = Warnings()
    found: Dict[str, float] = {}
    stop = threading.Event()
    watcher = threading.Thread(target=_failure_time, args=(comm.transport, time.monotonic(), found, stop), daemon=True)
    watcher.start()
    started = time.monotonic()
    comm.close()
    took = time.monotonic() - started
    stop.set()
    gate.set()
    stream.synchronize()
    watch.close()
    failure = comm.transport.failure()
    aborted_at = found.get("at")
    when = "never" if aborted_at is None else f"at {aborted_at:.2f} s"
    text = (
        f"close() took {took:.2f} s (host function {GATE:g} s, a PreMulSum kernel behind it); the communicator "
        f"was aborted {when}: {failure}; the kernel then gave {float(cupy_to_host(x)[0]):g} (2: it ran); "
        f"warnings: {watch.seen}"
    )
    good = failure is not None and aborted_at is not None and aborted_at < 4.0 and took < GATE + 5
    report("PASS" if good else "FAIL", "close", text)


def close_untimed() -> None:
    """close() with no timeout and a kernel that cannot run for GATE s: retired after about
    2 s (abort_grace), nothing freed, so it does not wait for the kernel."""
    comm = one_rank(0)  # 0: no timeout
    x = cupy_from_host(np.ones(1 << 12, np.float32))
    stream, gate = blocked_stream(GATE)
    comm.allreduce(x, IN_FLIGHT, stream=stream)  # a kernel in flight
    watch = Warnings()
    started = time.monotonic()
    comm.close()
    took = time.monotonic() - started
    gate.set()
    stream.synchronize()
    watch.close()
    good = comm.transport.timeout is None and took < GATE - 2 and comm.transport.failure() is None
    report("PASS" if good else "FAIL", "close_untimed",
           f"close() took {took:.2f} s (host function {GATE:g} s, a PreMulSum kernel behind it, transport "
           f"timeout {comm.transport.timeout}); the kernel then gave {float(cupy_to_host(x)[0]):g}; "
           f"warnings: {watch.seen}")  # fmt: skip


# -- 2. a global-mode capture after a dropped Work ----------------------------------------------


def capture() -> None:
    import cupy

    comm = one_rank(30.0)
    stream = cupy.cuda.Stream(non_blocking=True)
    z = cupy_from_host(np.ones(1 << 10, np.float32))
    y = cupy_from_host(np.full(1 << 10, 3.0, np.float32))
    comm.allreduce(z, denseccl.PreMulSum(2.0), async_op=True, stream=stream)  # dropped: the flow keeps it
    gc.collect()
    stream.synchronize()
    idle = comm.transport.wait_idle(5)
    steps = [f"wait_idle {idle}", f"dropped Works kept {len(comm.flow.orphans)}"]
    graph = None
    with stream:  # the capturing stream is the current one (a wait never joins the legacy stream)
        stream.begin_capture(mode=cupy.cuda.runtime.streamCaptureModeGlobal)
        try:
            comm.allreduce(y, denseccl.PreMulSum(2.0))
            steps.append("captured call returned")
        except Exception as error:  # noqa: BLE001
            steps.append(f"captured call raised {type(error).__name__}: {error}")
        finally:
            try:
                graph = stream.end_capture()
                steps.append("end_capture ok")
            except Exception as error:  # noqa: BLE001
                steps.append(f"end_capture raised {type(error).__name__}: {error}")
    good = graph is not None
    if graph is not None:
        graph.launch(stream)
        stream.synchronize()
        values = cupy_to_host(y)
        good = bool(np.all(values == 6.0))
        steps.append(f"replay gives {values[:2]} (want 6)")
    comm.allreduce(y, stream=stream)  # eager again: completes the dropped Work
    steps.append(f"dropped Works kept after an eager call {len(comm.flow.orphans)}")
    report("PASS" if good else "FAIL", "capture (CuPy, global mode)", "; ".join(steps))
    torch = torch_cuda()
    if torch is None:
        report("INFO", "capture (torch)", "torch has no CUDA here")
    else:
        _capture_torch(comm, torch)
    comm.close()


def _capture_torch(comm: Any, torch: Any) -> None:
    """torch.cuda.graph (global mode, torch's default) after a dropped Work."""
    device = f"cuda:{comm.transport.device}"
    t = torch.ones(1 << 10, device=device)
    y = torch.full((1 << 10,), 3.0, device=device)
    side = torch.cuda.Stream(device=device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):  # warm-up on a side stream, as torch.cuda.graphs asks
        comm.allreduce(t, denseccl.PreMulSum(2.0), async_op=True)  # dropped
    torch.cuda.current_stream(device).wait_stream(side)
    gc.collect()
    torch.cuda.synchronize()
    steps = [f"wait_idle {comm.transport.wait_idle(5)}"]
    graph = torch.cuda.CUDAGraph()
    good = False
    try:
        with torch.cuda.graph(graph):
            comm.allreduce(y, denseccl.PreMulSum(2.0))
        graph.replay()
        torch.cuda.synchronize()
        good = bool(torch.all(y == 6.0).item())
        steps.append(f"captured and replayed: {y[:2].tolist()} (want 6)")
    except Exception as error:  # noqa: BLE001
        steps.append(f"raised {type(error).__name__}: {error}")
    report("PASS" if good else "FAIL", "capture (torch)", "; ".join(steps))


# -- 3. a capture stream destroyed after its capture ----------------------------------------------


def freed_stream() -> None:
    import cupy

    comm = one_rank(3.0)
    x = cupy_from_host(np.ones(1 << 10, np.float32))
    stream = cupy.cuda.Stream(non_blocking=True)
    comm.allreduce(x, IN_FLIGHT, stream=stream)  # warm-up: a kernel, as is the captured call
    stream.synchronize()
    comm.transport.wait_idle(5)
    with stream:
        stream.begin_capture()
        comm.allreduce(x, IN_FLIGHT)  # captured (a kernel node): the device's capture gate knows this stream
        graph = stream.end_capture()
    pointer = stream.ptr
    del stream, graph
    gc.collect()  # CuPy destroys the stream
    try:
        asked = f"returns {cupy.cuda.runtime.streamIsCapturing(pointer)}"
    except Exception as error:  # noqa: BLE001
        asked = f"raises {type(error).__name__} (status {getattr(error, 'status', None)}): {error}"
    running = comm.transport.events.capture_in_progress()
    comm.allreduce(x, IN_FLIGHT)  # eager, a kernel: the watchdog must retire it
    idle = comm.transport.wait_idle(5)
    report("PASS" if not running and idle else "FAIL", "freed_stream",
           f"cudaStreamIsCapturing on the destroyed stream {asked}; capture_in_progress {running}; "
           f"wait_idle after an eager call {idle}")  # fmt: skip
    comm.close()


# -- 4. torch's default stream ----------------------------------------------------------------------


def default_stream() -> None:
    torch = torch_cuda()
    if torch is None:
        report("INFO", "default_stream", "torch has no CUDA here")
        return
    external = torch.cuda.ExternalStream(0)
    default = torch.cuda.default_stream()
    comm = one_rank(30.0)
    seen: List[int] = []
    record = torch.Tensor.record_stream

    def spy(tensor: Any, stream: Any) -> None:
        seen.append(int(stream.cuda_stream))
        record(tensor, stream)

    torch.Tensor.record_stream = spy  # type: ignore[method-assign]
    try:
        t = torch.ones(1 << 10, device=f"cuda:{comm.transport.device}")
        comm.allreduce(t)  # torch's current stream: the default one
        torch.cuda.synchronize()
    finally:
        torch.Tensor.record_stream = record  # type: ignore[method-assign]
    good = seen == [0] and int(default.cuda_stream) == 0
    report("PASS" if good else "FAIL", "default_stream",
           f"ExternalStream(0).cuda_stream = {external.cuda_stream:#x}, default_stream().cuda_stream = "
           f"{default.cuda_stream:#x}; denseccl recorded the tensor on {[hex(s) for s in seen]}")  # fmt: skip
    comm.close()


def stream_lifetime() -> None:
    """A torch tensor allreduced on a CuPy stream the caller lets go at once: torch's allocator
    records an event on that stream when the tensor's memory is freed, which fails ("invalid
    resource handle") if the stream was destroyed first; denseccl keeps it until then."""
    import cupy

    torch = torch_cuda()
    if torch is None:
        report("INFO", "stream_lifetime", "skipped: torch has no CUDA here")
        return
    comm = one_rank(30)
    device = comm.transport.device
    t = torch.full((1 << 16,), 2.0, device=f"cuda:{device}")
    view = t[1:]
    stream = cupy.cuda.Stream(non_blocking=True)
    comm.allreduce(t, "sum", out=None, stream=stream)  # out of place would keep t; in place records it
    stream.synchronize()
    pointer = stream.ptr
    del stream
    gc.collect()
    problems = []
    try:
        total = float(view.sum().item())  # the view still holds the memory
        del t, view
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()  # frees the block: its events are recorded on the streams it was used on
        torch.cuda.synchronize()
        again = torch.ones(1 << 16, device=f"cuda:{device}")
        total_again = float(again.sum().item())
    except Exception as error:  # noqa: BLE001
        problems.append(f"{type(error).__name__}: {error}")
        total = total_again = -1.0
    good = not problems and total == 2.0 * ((1 << 16) - 1) and total_again == float(1 << 16)
    report("PASS" if good else "FAIL", "stream_lifetime",
           f"tensor recorded on CuPy stream {pointer:#x}, released by the caller before the tensor; "
           f"free and reuse: {problems or 'no error'}")  # fmt: skip
    comm.close()


PROBES: Dict[str, Callable[[], None]] = {
    "destroy": destroy, "close": close, "close_untimed": close_untimed, "capture": capture,
    "freed_stream": freed_stream, "default_stream": default_stream, "stream_lifetime": stream_lifetime,
}


def main() -> None:
    from tests.gpu.support import gpu_problem

    problem = gpu_problem()
    if problem is not None:
        print(f"SKIP probes: {problem}", flush=True)
        sys.exit(0)
    for name in sys.argv[1:] or list(PROBES):
        try:
            PROBES[name]()
        except Exception as error:  # noqa: BLE001
            report("FAIL", name, f"{type(error).__name__}: {error}\n{traceback.format_exc()}")
    sys.exit(1 if any(line.startswith("FAIL") for line in RESULTS) else 0)


if __name__ == "__main__":
    main()
