"""Progress within a config: a rank's measuring loop says how far it got; whoever shows it listens.

A leaf module, so that the loop (harness) need not know who shows progress: the rank pool's worker
forwards rank 0's reports to the parent, which draws them under the sweep's bar (only where stderr is
a terminal); under torchrun rank 0 draws them itself. Nobody listening: reporting costs one check.
"""
from __future__ import annotations

import sys
from typing import Callable

_listener: Callable[[str, int, int], None] | None = None


def listen(listener: Callable[[str, int, int], None] | None) -> None:
    """Send this process's reports to `listener(phase, done, total)` from now on (None: to nobody)."""
    global _listener
    _listener = listener


def report(phase: str, done: int, total: int) -> None:
    """`done` of `total` iterations of `phase` ("warm-up", "measured", or "choosing the bucket cap"
    under --bucket-mb auto) are finished."""
    if _listener is not None:
        _listener(phase, done, total)


def shown(stream=None) -> bool:
    """Whether progress bars are drawn: only where `stream` (default stderr) is a terminal, so that a
    log or CI's output holds the summary lines alone."""
    stream = sys.stderr if stream is None else stream
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a replaced or closed stream
        return False
