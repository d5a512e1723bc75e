"""This machine's timing log: one short JSON line per successful `run` config, whatever its `--out`, so
that `run --dry-run` can estimate from every config this machine measured, not only from the records in
the `--out` it is given.

The log lives in this machine's folder (results/runs/<machine>/timings.log, under $DDPBENCH_RESULTS). It
is not a record file: its name does not end in .jsonl, so readers of that folder's records pass over it.
A line holds the config (fields at the value older records imply left out, as config_key does), the
timing fields `dryrun.estimate` reads, the machine's id and when it was measured.

Crash-safe: each line is appended in one write under a lock, after a newline where a crash left a torn
last line, and a reader skips any line that is not a whole JSON object (such a fragment). Bounded: once
the log passes MAX_BYTES it is renamed to timings.log.1 (replacing the one before) and a new log begins,
so both together hold at most about 2 x MAX_BYTES, the newest few thousand configs; both are read.
"""
from __future__ import annotations

import fcntl
import json
import os
import sys
from pathlib import Path

from experiments.core.machine import runs_folder
from experiments.core.records import LATER_FIELDS

FILE_NAME = "timings.log"
MAX_BYTES = 1 << 20  # ~1500 configs of ~700 bytes per generation: reading both takes milliseconds
TIMING_FIELDS = ("setup_s", "warmup_s", "measured_s", "config_wall_s")
_warned = False  # a log that cannot be written is said once per process, not once per config


def log_path(folder: Path | None = None) -> Path:
    """The timing log of this machine (in `folder`, default this machine's runs folder)."""
    return (folder or runs_folder()) / FILE_NAME


def entry(record: dict) -> dict | None:
    """The log line of a run record: its config, the timing dryrun.estimate reads, the machine's id and
    the time; None for a record without them (failed, or without timings)."""
    timing, config, env = record.get("timing"), record.get("config"), record.get("env") or {}
    if record.get("status") != "ok" or not isinstance(timing, dict) or not isinstance(config, dict):
        return None
    if any(not isinstance(timing.get(k), (int, float)) for k in TIMING_FIELDS):
        return None
    return {"config": {k: v for k, v in config.items() if LATER_FIELDS.get(k, ...) != v},
            "timing": {k: timing[k] for k in TIMING_FIELDS}, "machine_id": env.get("machine_id"),
            "time": env.get("time")}


def append(record: dict, folder: Path | None = None) -> None:
    """Add the line of `record` (see `entry`) to the timing log; a log that cannot be written is said
    once, on stderr, and the run goes on (its records in --out are what counts)."""
    global _warned
    line = entry(record)
    if line is None:
        return
    path = log_path(folder)
    data = (json.dumps(line, allow_nan=False, separators=(",", ":")) + "\n").encode()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # another ddpbench may be appending too
            held = os.fstat(fd)
            if held.st_size >= MAX_BYTES and held.st_ino == os.stat(path).st_ino:  # (not rotated meanwhile)
                # Rotated under the lock: a writer that opened the log before appends into timings.log.1,
                # which is read too.
                os.replace(path, path.with_name(FILE_NAME + ".1"))
                os.close(fd)
                fd = -1  # (closed: not to be closed again should the next open fail)
                fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
                fcntl.flock(fd, fcntl.LOCK_EX)
            size = os.fstat(fd).st_size
            # After a crash's torn line the new one starts on a line of its own (the fragment is skipped).
            torn = size > 0 and os.pread(fd, 1, size - 1) != b"\n"
            os.write(fd, b"\n" * torn + data)  # one write of a whole line: a crash tears at most the last
        finally:
            if fd >= 0:
                os.close(fd)
    except (OSError, ValueError) as error:
        if not _warned:
            _warned = True
            print(f"ddpbench: note: cannot add to the timing log {path} ({getattr(error, 'strerror', None) or error}); "
                  "`run --dry-run` estimates only from the records it is given", file=sys.stderr)


def read(machine_id: str, folder: Path | None = None) -> list[dict]:
    """The logged timings of `machine_id` as run-record-like dicts ({kind, status, config, timing, env});
    lines that are not whole JSON objects (a torn last line) are skipped; a missing log gives none."""
    path = log_path(folder)
    found = []
    for file in (path.with_name(FILE_NAME + ".1"), path):
        try:
            lines = file.read_bytes().split(b"\n")
        except OSError:
            continue
        for line in lines:
            try:
                item = json.loads(line)
            except (ValueError, UnicodeDecodeError):
                continue  # an empty or torn line
            if (not isinstance(item, dict) or item.get("machine_id") != machine_id
                    or not isinstance(item.get("config"), dict) or not isinstance(item.get("timing"), dict)):
                continue
            found.append({"kind": "run", "status": "ok", "config": {**LATER_FIELDS, **item["config"]},
                          "timing": item["timing"], "env": {"machine_id": machine_id, "time": item.get("time")}})
    return found
