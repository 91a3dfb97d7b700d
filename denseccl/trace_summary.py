"""``python -m denseccl.trace_summary DIR``: read every rank's flight recorder dump in ``DIR`` and say,
per communicator, which rank is behind and at which call, which rank wrote no dump, which calls
failed where, and where the ranks' descriptors differ. ``DIR`` is one job's folder, or the folder
above the job folders (``DENSECCL_TRACE_DIR``, the per-user default), where the newest job is read.

A rank is behind when it recorded fewer calls than the others (the call it never made is the
next one of its sequence, as the others recorded it), when it began the last call only after a
peer had given up on it, or when it wrote no dump at all (it was stopped, killed, or stuck
outside denseccl: only a rank that reaches a timeout, a peer's give-up, or a request writes one).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .agreement import Descriptor, differing_fields, rank_list
from .recorder import FORMAT

#: the differing calls a summary shows per communicator
SHOWN = 5


def load(directory: str) -> Dict[int, Dict[int, Dict[str, Any]]]:
    """The dumps in ``directory``: communicator number -> rank -> dump."""
    found: Dict[int, Dict[int, Dict[str, Any]]] = {}
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".json"):
            continue
        with open(os.path.join(directory, name)) as handle:
            try:
                dump = json.load(handle)
            except ValueError:
                continue
        if isinstance(dump, dict) and dump.get("format") == FORMAT:
            found.setdefault(dump["communicator"], {})[dump["rank"]] = dump
    return found


def job_folders(directory: str) -> List[str]:
    """The folders in ``directory`` that hold dumps (one per job), the newest dump's first."""
    found = []
    for name in os.listdir(directory):
        folder = os.path.join(directory, name)
        if os.path.isdir(folder) and not os.path.islink(folder):
            times = [entry.stat().st_mtime for entry in os.scandir(folder) if entry.name.endswith(".json")]
            if times:
                found.append((max(times), folder))
    return [folder for _, folder in sorted(found, reverse=True)]


def describe(call: Dict[str, Any]) -> str:
    """A recorded call as the agreement's errors show a descriptor."""
    key = None
    if call.get("dtype") is not None:
        key = (call["dtype"], tuple(call["shape"]), tuple(call["layout"]))
    return Descriptor(call["collective"], call.get("root"), call.get("op"), key).describe()  # type: ignore[arg-type]


def summarize(dumps: Dict[int, Dict[str, Any]]) -> List[str]:
    """The summary lines of one communicator's dumps (rank -> dump)."""
    size = max(dump["size"] for dump in dumps.values())
    calls = {rank: {call["seq"]: call for call in dump["calls"]} for rank, dump in dumps.items()}
    recorded = {rank: dump["recorded"] for rank, dump in dumps.items()}
    missing = [rank for rank in range(size) if rank not in dumps]
    lines = [
        f"communicator {next(iter(dumps.values()))['communicator']}: {size} ranks, dumps from {rank_list(list(dumps))}",
        "  calls recorded: " + ", ".join(f"rank {rank}: {recorded[rank]}" for rank in sorted(recorded)),
    ]
    lines += _behind(calls, recorded, missing)
    for rank in sorted(calls):
        for seq, call in sorted(calls[rank].items()):
            if call["state"] == "failed":
                lines.append(f"  rank {rank}: call #{seq} ({describe(call)}) failed: {call['error'].splitlines()[0]}")
            elif call["state"] == "started":
                lines.append(f"  rank {rank}: call #{seq} ({describe(call)}) had not completed")
    lines += _differences(calls)
    return lines


def _behind(calls: Dict[int, Dict[int, Dict[str, Any]]], recorded: Dict[int, int], missing: List[int]) -> List[str]:
    furthest = max(recorded.values())
    ahead = [rank for rank, count in recorded.items() if count == furthest]
    lines = []
    for rank in sorted(recorded):
        count = recorded[rank]
        if count < furthest:
            made = [r for r in ahead if count in calls[r]]
            what = f" ({describe(calls[made[0]][count])})" if made else ""
            lines.append(
                f"  behind: rank {rank} never made call #{count}{what}, which {rank_list(ahead)} made "
                f"(its last call: #{count - 1})"
            )
    for rank in missing:
        waited = _last_calls(calls, ahead)
        lines.append(
            f"  behind: rank {rank} wrote no dump (stopped, killed, or stuck outside denseccl): "
            f"{rank_list(list(calls))} {waited}"
        )
    late = _late(calls, ahead, furthest - 1)
    if late:
        lines.append(late)
    if len(lines) == 0 and not missing:
        lines.append(f"  no rank is behind: every rank made {furthest} calls")
    return lines


def _last_calls(calls: Dict[int, Dict[int, Dict[str, Any]]], ahead: List[int]) -> str:
    seq = max(max(calls[rank], default=-1) for rank in ahead)
    if seq < 0:
        return "recorded no call"
    call = calls[ahead[0]][seq]
    state = "failed in" if any(calls[r].get(seq, {}).get("state") == "failed" for r in ahead) else "were last in"
    return f"{state} call #{seq} ({describe(call)}) without it"


def _late(calls: Dict[int, Dict[int, Dict[str, Any]]], ahead: List[int], seq: int) -> Optional[str]:
    """A rank that began call ``seq`` only after a peer had failed in it (it gave up waiting)."""
    failed = [(calls[r][seq]["failed"], r) for r in ahead if calls[r].get(seq, {}).get("state") == "failed"]
    if not failed or len(ahead) < 2:
        return None
    first, who = min(failed)
    late = [r for r in ahead if seq in calls[r] and calls[r][seq]["started"] > first]
    if not late or len(late) == len(ahead):
        return None
    delay = max(calls[r][seq]["started"] for r in late) - first
    return (
        f"  behind: {rank_list(late)} began call #{seq} ({describe(calls[late[0]][seq])}) only after rank {who} "
        f"had given up on it ({delay:.1f} s later)"
    )


def _differences(calls: Dict[int, Dict[int, Dict[str, Any]]]) -> List[str]:
    shared = set.intersection(*(set(entries) for entries in calls.values())) if calls else set()
    differing: List[Tuple[int, Dict[str, List[int]]]] = []
    for seq in sorted(shared):
        groups: Dict[str, List[int]] = {}
        for rank in sorted(calls):
            groups.setdefault(describe(calls[rank][seq]), []).append(rank)
        if len(groups) > 1:
            differing.append((seq, groups))
    if not differing:
        span = f" (#{min(shared)}-#{max(shared)})" if shared else ""
        return [f"  descriptors: every call the ranks' dumps share{span} is the same on every rank"]
    lines = []
    for seq, groups in differing[:SHOWN]:
        fields = differing_fields(calls[rank][seq] for rank in calls)
        lines.append(f"  descriptors differ at call #{seq} ({', '.join(fields)}):")
        lines += [f"    {rank_list(ranks)}: {text}" for text, ranks in groups.items()]
    if len(differing) > SHOWN:
        lines.append(f"  ... and {len(differing) - SHOWN} more calls whose descriptors differ")
    return lines


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m denseccl.trace_summary", description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", help="the folder of the dumps (DENSECCL_TRACE_DIR)")
    args = parser.parse_args(argv)
    if not os.path.isdir(args.directory):
        print(f"python -m denseccl.trace_summary: {args.directory} is not a folder", file=sys.stderr)
        return 2
    found = load(args.directory)
    jobs = [] if found else job_folders(args.directory)
    if jobs:
        others = f" (the newest of {len(jobs)} jobs; pass another job's folder to read it)" if len(jobs) > 1 else ""
        print(f"job folder {jobs[0]}{others}")
        found = load(jobs[0])
    if not found:
        print(f"python -m denseccl.trace_summary: no flight recorder dumps in {args.directory}", file=sys.stderr)
        return 2
    for number in sorted(found):
        print("\n".join(summarize(found[number])))
    return 0


__all__ = ["describe", "job_folders", "load", "main", "summarize"]


if __name__ == "__main__":
    sys.exit(main())
