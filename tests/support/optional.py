"""torch for the tests of core modules: the module when it is installed, else None, so that a
file's NumPy tests still run without torch and only the tests marked ``needs_torch`` skip."""

from __future__ import annotations

from typing import Any

import pytest

torch: Any
try:
    import torch
except ImportError:
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="needs torch")
