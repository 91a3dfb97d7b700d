"""Where a long run is, on stderr, so that a sweep that prints nothing for a minute is not
mistaken for a hang (rows go to stdout as each size completes, as nccl-tests prints them).

A line is written only when nothing was printed for ``every`` seconds (never with 0: ranks
other than 0 say nothing). On a terminal the line is rewritten in place and erased before the
next row; elsewhere (a pipe, mpiexec's forwarding) each is a plain line.
"""

from __future__ import annotations

import sys
import time
from typing import Callable, Optional, TextIO


class Progress:
    def __init__(self, every: float, stream: Optional[TextIO] = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.every = every
        self.stream = stream if stream is not None else sys.stderr
        self.clock = clock
        self.started = self.last = clock()
        try:
            self.tty = self.stream.isatty()
        except (AttributeError, ValueError):
            self.tty = False
        self.dirty = False
        self.section = ""

    def enter(self, section: str) -> None:
        """The part of the run now under way (prefixes every line)."""
        self.section = section

    def printed(self) -> None:
        """A row went to stdout: erase a status line on the terminal, restart the clock."""
        if self.dirty:
            self.stream.write("\r\033[K")
            self.stream.flush()
            self.dirty = False
        self.last = self.clock()

    def at(self, where: str) -> None:
        """The run reached ``where``; say so if nothing was printed for ``every`` seconds."""
        now = self.clock()
        if self.every <= 0 or now - self.last < self.every:
            return
        text = f"denseccl.bench: {now - self.started:.0f} s: {self.section}: {where}"
        if self.tty:
            self.stream.write("\r" + text[:150] + "\033[K")
            self.dirty = True
        else:
            self.stream.write(text + "\n")
        self.stream.flush()
        self.last = now

