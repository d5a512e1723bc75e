"""What Linux's /proc says about one process: its stat fields, and whether it still runs."""
from __future__ import annotations

import os


def process_stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command's name (state, parent, ..., so index i is the man
    page's field i + 3; the name in parentheses may hold spaces), or None where the process or /proc is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def process_lives(pid: int) -> bool:
    """Whether process `pid` still runs (a zombie has ended, just not yet been waited for)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    fields = process_stat(pid)
    return fields is None or fields[0] != "Z"  # no /proc: alive as far as can be told
