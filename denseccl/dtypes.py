"""The element types denseccl moves, and what the transports need to know of each.

Dtypes are named by strings (``"float32"``, ``"bfloat16"`` …) so that NumPy, CuPy and torch
arrays meet on common ground and layout keys compare equal across libraries.
"""

from __future__ import annotations

from typing import Dict, NamedTuple


class DType(NamedTuple):
    """What the transports need to know of an element type."""

    name: str
    itemsize: int
    kind: str  # "f" float, "i" signed int, "u" unsigned int, "b" bool, "c" complex


DTYPES: Dict[str, DType] = {
    d.name: d
    for d in (
        DType("bool", 1, "b"),
        DType("int8", 1, "i"),
        DType("uint8", 1, "u"),
        DType("int16", 2, "i"),
        DType("uint16", 2, "u"),
        DType("int32", 4, "i"),
        DType("uint32", 4, "u"),
        DType("int64", 8, "i"),
        DType("uint64", 8, "u"),
        DType("float16", 2, "f"),
        DType("bfloat16", 2, "f"),
        DType("float32", 4, "f"),
        DType("float64", 8, "f"),
        DType("complex64", 8, "c"),
        DType("complex128", 16, "c"),
        DType("float8_e4m3fn", 1, "f"),
        DType("float8_e5m2", 1, "f"),
    )
}
