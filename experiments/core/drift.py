"""A machine's launch-to-launch drift, as stored: how far one config's median latency strays between
separate process launches (measured by `ddpbench drift`, read by compare and the sweep report).

The drift file (results/runs/<machine>/drift.jsonl) holds run records tagged `"drift": {"session",
"launch"}`; the drift is the standard deviation of the launches' log medians about their session's mean,
pooled over sessions (launches - sessions degrees of freedom).
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from experiments.core.machine import runs_folder
from experiments.core.records import read_records

FILE_NAME = "drift.jsonl"


def drift_file(machine: str | None = None) -> Path:
    """A machine's drift file (this machine's by default): results/runs/<machine>/drift.jsonl."""
    return runs_folder(machine) / FILE_NAME


def session_medians(records: list[dict], machine_id: str | None = None) -> dict[str, list[float]]:
    """The median latency of each launch, by drift session, of the successful tagged run records (of
    the machine `machine_id` only, where given)."""
    sessions: dict[str, list[float]] = {}
    for record in records:
        tag = record.get("drift")
        if record.get("kind") != "run" or record.get("status") != "ok" or not isinstance(tag, dict):
            continue
        if machine_id is not None and record.get("env", {}).get("machine_id") != machine_id:
            continue
        sessions.setdefault(str(tag.get("session")), []).append(float(np.median(record["latency_s"])))
    return sessions


def pooled_drift(sessions: dict[str, list[float]]) -> dict | None:
    """The pooled standard deviation of log launch medians about each session's mean, with its degrees
    of freedom; None with no session of two launches or more."""
    logs = [np.log(medians) for medians in sessions.values() if len(medians) >= 2]
    df = sum(x.size - 1 for x in logs)
    if df < 1:
        return None
    squares = sum(float(((x - x.mean()) ** 2).sum()) for x in logs)
    return {"sd": math.sqrt(squares / df), "df": df, "launches": sum(x.size for x in logs), "sessions": len(logs)}


def stored_drift(path: Path, machine_id: str | None = None) -> dict | None:
    """The drift stored in `path` (see pooled_drift) and the file it came from; None where the file is
    missing or holds no session of two launches (of `machine_id`, where given)."""
    if not path.is_file():
        return None
    found = pooled_drift(session_medians(read_records(path), machine_id))
    return {**found, "file": str(path)} if found else None
