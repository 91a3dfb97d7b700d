"""Can two ranks share one GPU? Try it twice and record what NCCL says.

1. plain: two ranks on GPU 0 (CUDA_VISIBLE_DEVICES=0), nothing else set. denseccl is expected
   to refuse on both ranks before NCCL is asked ("runs one rank per GPU"), as NCCL would
   ("Duplicate GPU detected").
2. hostid: the same, but each rank has its own NCCL_HOSTID (with NCCL_SOCKET_IFNAME=lo,
   NCCL_IB_DISABLE=1), so that NCCL believes they are on two hosts and connects them through
   sockets.

usage: python tests/gpu/two_ranks.py [REPORT.json]
Prints a verdict per attempt and the mode the GPU tests should use (devices | hostid | no) on
its last line, as ``MODE=...``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.gpu.support import inner_timeout, spawn_ranks


def attempt(split_hosts: bool) -> dict:
    total = inner_timeout(150.0)  # both attempts within what run.sh gives the probe
    limit = total * (0.6 if split_hosts else 0.4)
    results = spawn_ranks(
        2, ["tests/gpu/rank.py", "probe"], split_hosts=split_hosts, timeout=limit,
        extra_env={"CUDA_VISIBLE_DEVICES": "0"},
    )
    text = "\n".join(r["stdout"] + r["stderr"] for r in results)
    ok = all(r["returncode"] == 0 for r in results)
    refused_early = sum("runs one rank per GPU" in r["stdout"] + r["stderr"] for r in results)
    if ok:
        verdict = "works"
    elif refused_early == len(results):
        verdict = "refused by denseccl before NCCL, on every rank (one rank per GPU)"
    elif "Duplicate GPU" in text:
        verdict = f"refused by NCCL (Duplicate GPU detected; denseccl's own check on {refused_early} of 2 ranks)"
    else:
        verdict = "failed"
    tail = [line for line in text.splitlines() if "NCCL" in line or "Error" in line or "error" in line][-12:]
    return {
        "split_hosts": split_hosts, "ok": ok, "verdict": verdict, "probe": [j for r in results for j in r["json"]],
        "evidence": tail,
    }


def main() -> None:
    import cupy

    devices = cupy.cuda.runtime.getDeviceCount()
    report = {"devices": devices, "plain": attempt(False), "hostid": attempt(True)}
    if devices >= 2:
        mode = "devices"
    elif report["hostid"]["ok"]:
        mode = "hostid"
    else:
        mode = "no"
    report["mode"] = mode
    for name in ("plain", "hostid"):
        print(f"two ranks on one GPU, {name}: {report[name]['verdict']}")
        for line in report[name]["evidence"]:
            print(f"    {line}")
    if len(sys.argv) > 1:
        Path(sys.argv[1]).write_text(json.dumps(report, indent=2, default=str))
    print(f"MODE={mode}", flush=True)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
