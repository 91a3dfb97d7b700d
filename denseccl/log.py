"""denseccl's debug log: the standard library's ``logging`` under the name ``"denseccl"``.

``DENSECCL_DEBUG`` (like ``NCCL_DEBUG``) sets how much is said: ``WARN`` (default: warnings
only), ``INFO`` (bootstrap decisions, the agreement path each communicator takes) or ``TRACE``
(also every call's descriptor and time). When the variable is set, denseccl attaches its own
stderr handler whose lines carry the rank; otherwise the application's logging configuration
decides, as for any library logger.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, Optional

from . import config

#: below DEBUG: one line per collective call
TRACE = 5
logging.addLevelName(TRACE, "TRACE")

logger = logging.getLogger("denseccl")

_LEVELS = {"WARN": logging.WARNING, "INFO": logging.INFO, "TRACE": TRACE}
_RANK: Optional[int] = None


class _RankFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.denseccl_rank = "?" if _RANK is None else _RANK
        return True


def _configure() -> None:
    if "DENSECCL_DEBUG" not in os.environ:
        return
    logger.setLevel(_LEVELS[config.settings().debug])
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(_RankFilter())
    handler.setFormatter(
        logging.Formatter("[denseccl rank %(denseccl_rank)s pid %(process)d] %(levelname)s %(message)s")
    )
    logger.addHandler(handler)
    logger.propagate = False


def set_rank(rank: int) -> None:
    """Name this process's rank in later lines (the first communicator built sets it)."""
    global _RANK
    if _RANK is None:
        _RANK = rank


def tracing() -> bool:
    """Whether TRACE lines are wanted: check before building one on the fast path."""
    return logger.isEnabledFor(TRACE)


def trace(message: str, *args: Any) -> None:
    logger.log(TRACE, message, *args)


info = logger.info
warning = logger.warning


_configure()

__all__ = ["TRACE", "info", "logger", "set_rank", "trace", "tracing", "warning"]
