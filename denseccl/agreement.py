"""The cross-rank agreement check: before data moves, every rank must hold the same descriptor
(collective, root, op, layout key of the input or per-rank block; the key carries dtype and
shape).

Cheap path: one step of the control channel (``all_equal``) tells every rank at once whether all
digests are equal and nobody's input was invalid (each channel's message: docs/design.md, "The
agreement protocol"). Only on disagreement do the ranks exchange full descriptors, so that
every rank raises the same, complete error.
"""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from typing import Any, Dict, Iterable, List, Mapping, NamedTuple, NoReturn, Optional, Sequence

from .errors import MismatchError
from .layout import LayoutKey
from .transport import Step
from .channel.base import ControlChannel

#: the fields of a descriptor, as reports name them
FIELDS = ("collective", "root", "op", "dtype", "shape", "layout")


class Descriptor(NamedTuple):
    """What every rank must agree on before a collective."""

    collective: str
    root: Optional[int] = None
    op: Optional[str] = None
    key: Optional[LayoutKey] = None

    def fields(self) -> Dict[str, object]:
        dtype, shape, strides = self.key if self.key is not None else (None, None, None)
        return {
            "collective": self.collective, "root": self.root, "op": self.op,
            "dtype": dtype, "shape": shape, "layout": strides,
        }

    def describe(self) -> str:
        words = [self.collective]
        if self.root is not None:
            words.append(f"root={self.root}")
        if self.op is not None:
            words.append(f"op={self.op}")
        if self.key is not None:
            dtype, shape, strides = self.key
            shown = tuple("*" if s is None else s for s in strides)
            words.append(f"{dtype} shape {tuple(shape)} strides {shown}".replace("'", ""))
        return " ".join(words)


@lru_cache(maxsize=4096)
def digest(descriptor: Descriptor) -> int:
    """A 63-bit digest, stable across processes (unlike ``hash`` of strings)."""
    raw = hashlib.blake2b(repr(tuple(descriptor)).encode(), digest_size=8).digest()
    return int.from_bytes(raw, "little") >> 1


def agree(
    control: ControlChannel, descriptor: Descriptor, deadline: Optional[float], invalid: Optional[BaseException] = None,
    value: Optional[int] = None, step: Optional[Step] = None, address: int = 0,
) -> None:
    """The agreement step, the only entry to it: return when every rank holds ``descriptor``
    and none is invalid. Otherwise raise on every rank: ``invalid`` itself on a rank that
    passed one, :class:`MismatchError` elsewhere. ``value``: ``digest(descriptor)`` when the
    caller has it already (a prepared call). ``step``: a prepared call's own form of the step
    (``Start.step``, given ``address``), else the channel's ``all_equal``."""
    if value is None:
        value = digest(descriptor)
    if step is None:
        agreed = control.all_equal(value, invalid is not None, deadline)
    else:
        agreed = step(control, value, invalid is not None, deadline, address)
    if not agreed:
        disagree(control, descriptor, deadline, invalid)


def disagree(
    control: ControlChannel, descriptor: Descriptor, deadline: Optional[float], invalid: Optional[BaseException] = None
) -> NoReturn:
    """The second step, taken by every rank once ``all_equal`` has said no: exchange the full
    descriptors and raise the same report everywhere (``invalid`` itself on its own rank)."""
    text = None if invalid is None else f"{type(invalid).__name__}: {invalid}"
    mine = {"descriptor": list(descriptor), "invalid": text}
    payloads = control.allgather_bytes(json.dumps(mine).encode(), deadline)
    report = mismatch_report([json.loads(p) for p in payloads], control.rank)
    if invalid is not None:
        raise invalid
    raise MismatchError(report)


def _descriptor(raw: Sequence[Any]) -> Descriptor:
    collective, root, op, key = raw
    if key is not None:
        dtype, shape, strides = key
        key = (dtype, tuple(shape), tuple(strides))
    return Descriptor(collective, root, op, key)


def rank_list(ranks: Iterable[int]) -> str:
    """``rank 3`` or ``ranks 0, 2``."""
    ranks = sorted(ranks)
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def differing_fields(entries: Iterable[Mapping[str, object]]) -> List[str]:
    """The :data:`FIELDS` whose values differ among ``entries`` (descriptors' fields)."""
    values = [[repr(entry.get(name)) for name in FIELDS] for entry in entries]
    return [name for name, column in zip(FIELDS, zip(*values)) if len(set(column)) > 1]


def mismatch_report(entries: Sequence[Dict[str, object]], my_rank: int) -> str:
    """The error text: each distinct descriptor with the ranks holding it, what differs, and
    what to do."""
    groups: Dict[str, List[int]] = {}
    descriptors: Dict[str, Descriptor] = {}
    invalid_lines = []
    for rank, entry in enumerate(entries):
        descriptor = _descriptor(entry["descriptor"])  # type: ignore[arg-type]
        if entry["invalid"] is not None:
            invalid_lines.append(f"  rank {rank}: {descriptor.collective} with an invalid input ({entry['invalid']})")
            continue
        line = descriptor.describe()
        groups.setdefault(line, []).append(rank)
        descriptors[line] = descriptor
    lines = [f"  {rank_list(ranks)}: {line}" for line, ranks in groups.items()]
    differing = differing_fields(d.fields() for d in descriptors.values())
    if invalid_lines and not differing:
        headline = "a peer's input failed validation"
    else:
        headline = "ranks disagree on " + (", ".join(differing) if differing else "the call")
    return (
        f"collective mismatch seen by rank {my_rank}: {headline}.\n"
        + "\n".join(lines + invalid_lines)
        + "\nEvery rank must call the same collective with the same root, op, dtype, shape and layout "
        "(strides of size-1 dims excepted). Nothing was sent and the communicator is still usable."
    )
