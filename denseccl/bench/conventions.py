"""nccl-tests conventions, as pure functions: collective names, size and count, bandwidths.

* ``size`` is the larger of the send and receive buffers in bytes; ``count`` is the element
  count passed to the library, which is per rank for allgather and reduce-scatter.
* ``algbw = size / time`` and ``busbw = algbw * factor(collective, nranks)``, in GB/s with
  GB = 1e9 bytes (nccl-tests ``*GetBw`` and ``doc/PERFORMANCE.md``).
"""

from __future__ import annotations

import re
from typing import Callable, Dict, List, Tuple

#: Collectives in nccl-tests order, with the names nccl-tests prints.
COLLECTIVES: Tuple[str, ...] = ("allreduce", "reduce", "broadcast", "allgather", "reduce_scatter")
NCCL_TESTS_NAMES: Dict[str, str] = {
    "allreduce": "all_reduce", "reduce": "reduce", "broadcast": "broadcast", "allgather": "all_gather",
    "reduce_scatter": "reduce_scatter",
}
ROOTED = frozenset({"reduce", "broadcast"})
REDUCING = frozenset({"allreduce", "reduce", "reduce_scatter"})

#: numpy-style dtype name -> the type name nccl-tests prints.
TYPE_NAMES: Dict[str, str] = {
    "int8": "int8", "uint8": "uint8", "int32": "int32", "uint32": "uint32", "int64": "int64", "uint64": "uint64",
    "float16": "half", "float32": "float", "float64": "double", "bfloat16": "bfloat16",
}
ITEMSIZES: Dict[str, int] = {
    "int8": 1, "uint8": 1, "int32": 4, "uint32": 4, "int64": 8, "uint64": 8,
    "float16": 2, "float32": 4, "float64": 8, "bfloat16": 2,
}
_TYPE_ALIASES: Dict[str, str] = {
    **{name: name for name in TYPE_NAMES},
    **{printed: name for name, printed in TYPE_NAMES.items()},
    "char": "int8", "int": "int32", "uint": "uint32", "long": "int64", "ulong": "uint64",
    "fp16": "float16", "bf16": "bfloat16", "fp32": "float32", "fp64": "float64",
}
OPS: Tuple[str, ...] = ("sum", "prod", "max", "min", "avg")
LAYOUTS: Tuple[str, ...] = ("contiguous", "channels_last", "transposed", "reversed")


def bus_factor(collective: str, nranks: int) -> float:
    """busbw / algbw for ``collective`` on ``nranks`` ranks (nccl-tests' factors)."""
    if collective == "allreduce":
        return 2.0 * (nranks - 1) / nranks
    if collective in ("allgather", "reduce_scatter"):
        return (nranks - 1) / nranks
    if collective in ("broadcast", "reduce"):
        return 1.0
    raise ValueError(f"unknown collective {collective!r}")


def count_for(collective: str, size: int, itemsize: int, nranks: int) -> int:
    """Elements passed to the library for a test size in bytes (rounded down, as nccl-tests
    does): per rank for allgather and reduce-scatter, the whole array otherwise."""
    count = size // itemsize
    if collective in ("allgather", "reduce_scatter"):
        count //= nranks
    return count


def size_of(collective: str, count: int, itemsize: int, nranks: int) -> int:
    """Bytes of the larger buffer: ``count * itemsize``, times ``nranks`` for allgather (its
    output) and reduce-scatter (its input)."""
    size = count * itemsize
    if collective in ("allgather", "reduce_scatter"):
        size *= nranks
    return size


def bandwidths(collective: str, size: int, seconds: float, nranks: int) -> Tuple[float, float]:
    """``(algbw, busbw)`` in GB/s (1e9 bytes) for ``size`` bytes moved in ``seconds``."""
    if seconds <= 0:
        return 0.0, 0.0
    algbw = size / 1e9 / seconds
    return algbw, algbw * bus_factor(collective, nranks)


_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    """``4096``, ``4K``, ``1.5M``, ``1G`` (binary units, any case, as nccl-tests' ``parsesize``;
    ``KiB``/``KB`` too) -> bytes, rounded down."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([KMGkmg]?)(?:i?[Bb])?\s*", text)
    if match is None:
        raise ValueError(f"not a size: {text!r} (use e.g. 4096, 4K, 1.5M, 1G)")
    return int(float(match.group(1)) * _UNITS[match.group(2).upper()])


def sizes(minimum: int, maximum: int, factor: float = 1.0, increment: int = 1 << 20) -> List[int]:
    """Test sizes from ``minimum`` to ``maximum`` as nccl-tests steps them: multiplied by
    ``factor`` when it is > 1 (``-f``), else increased by ``increment`` bytes (``-i``)."""
    if minimum <= 0 or maximum < minimum:
        raise ValueError(f"need 0 < minbytes <= maxbytes, got {minimum} and {maximum}")
    if factor <= 1 and increment <= 0 and maximum > minimum:
        raise ValueError(f"with -f {factor:g} the sizes grow by -i bytes, which must be > 0 (got {increment})")
    found, size = [], minimum
    while size <= maximum:
        found.append(size)
        if factor > 1:
            size = max(int(size * factor), size + 1)
        elif increment > 0:
            size += increment
        else:
            break
    return found


def dtype_name(text: str) -> str:
    """A dtype given as numpy or nccl-tests name -> the numpy-style name."""
    name = _TYPE_ALIASES.get(text.strip().lower())
    if name is None:
        raise ValueError(f"unknown type {text!r}; use one of {', '.join(TYPE_NAMES)} "
                         "(or nccl-tests names: float, half, double, ...)")
    return name


def collective_name(text: str) -> str:
    """A collective given as denseccl or nccl-tests name -> the denseccl name."""
    word = text.strip().lower().replace("-", "_")
    for name, printed in NCCL_TESTS_NAMES.items():
        if word in (name, printed, printed.replace("_", ""), name.replace("_", "")):
            return name
    raise ValueError(f"unknown collective {text!r}; use one of {', '.join(COLLECTIVES)} or all")


def expand(text: str, known: Tuple[str, ...], normalise: Callable[[str], str] = lambda word: word) -> List[str]:
    """A comma list or ``all`` -> names, each normalised and checked, order kept, no repeats."""
    words = [w for w in text.split(",") if w.strip()]
    if any(w.strip().lower() == "all" for w in words):
        return list(known)
    found: List[str] = []
    for word in words:
        name = normalise(word.strip())
        if name not in known:
            raise ValueError(f"unknown value {word!r}; use one of {', '.join(known)} or all")
        if name not in found:
            found.append(name)
    return found
