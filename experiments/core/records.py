"""The record store: one JSON line per measured config (or all-reduce row, or training run).

Every record carries `schema_version`; readers refuse versions they do not know. Appends are one
`write` of a whole line to a file opened for appending, so a crash cannot interleave records; a torn
last line (power loss mid-write) is skipped by the reader with a warning, and never counts as done.
"""
from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

SCHEMA_VERSION = 2  # 2: run records no longer store `breakdown_s` (derived from `phases_s` on loading)
READABLE_VERSIONS = (1, 2)
KINDS = ("run", "allreduce", "train", "profile")
# The phases of an iteration a run record times (`phases_s`), in their order within the iteration.
RUN_PHASES = ("forward", "backward", "exposed_comm", "optimizer")


class SchemaError(ValueError):
    """A record file written by an incompatible version of ddpbench."""


def append_record(path: Path, record: dict) -> None:
    """Append `record` as one line, in one write call, and flush it to disk."""
    line = (json.dumps({"schema_version": SCHEMA_VERSION, **record}, allow_nan=False) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        written = os.write(fd, line)
        if written != len(line):
            raise OSError(f"short write to {path}: {written} of {len(line)} bytes")
        os.fsync(fd)
    finally:
        os.close(fd)


def read_records(path: Path | str) -> list[dict]:
    """Every record in a JSON-lines file, or in every *.jsonl file under a folder."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no record file or folder at {path}")
    files = sorted(path.rglob("*.jsonl")) if path.is_dir() else [path]
    records = []
    for file in files:
        lines = file.read_bytes().split(b"\n")
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                if number == len(lines):  # the last line, without its newline: torn by a crash
                    warnings.warn(f"{file}:{number}: skipping a torn last line", stacklevel=2)
                    continue
                raise SchemaError(f"{file}:{number}: not a JSON record") from None
            version = record.get("schema_version")
            if version not in READABLE_VERSIONS:
                raise SchemaError(
                    f"{file}:{number}: schema_version {version!r}, but this ddpbench reads versions "
                    f"{' and '.join(map(str, READABLE_VERSIONS))}; re-run the measurement or use the "
                    "ddpbench that wrote it"
                )
            records.append(record)
    return records


def load_records(path: Path | str, kind: str = "run"):
    """Records of one kind as a pandas DataFrame: config fields as columns, plus the summary and each
    phase's median (`forward_s`, `backward_s`, ...; see stats.phase_medians)."""
    import pandas as pd

    from experiments.core.stats import phase_medians  # numpy and scipy: only for readers that analyse

    if kind not in KINDS:
        raise ValueError(f"kind={kind!r} is unknown; choose one of {', '.join(KINDS)}")
    rows = []
    for record in read_records(path):
        if record.get("kind") != kind:
            continue
        row = {**LATER_FIELDS, **record.get("config", {}), "status": record["status"]}
        # (version 1 records also store `breakdown_s`, by an older rule: left out)
        row.update({f"{k}": v for k, v in record.items() if k not in ("config", "summary", "breakdown_s", "env")})
        row.update({f"summary_{k}": v for k, v in (record.get("summary") or {}).items()})
        if record.get("phases_s"):  # derived from the raw samples, so that old records follow the same rule
            medians = phase_medians(record["phases_s"], record["config"].get("sync_every", 1))
            row.update({f"{phase}_s": v for phase, v in medians.items()})
        row.update({f"env_{k}": v for k, v in (record.get("env") or {}).items()})
        rows.append(row)
    return pd.DataFrame(rows)


# Config fields added after records were first stored, with the value every older record implies.
LATER_FIELDS = {"link": "none", "ranks_per_host": 1, "compute": "real", "compute_profile": "", "time_dilation": 1.0,
                "model_config": "", "amp": "none", "model_hash": ""}  # (the user's own model, issue 15)


def config_key(config: dict) -> str:
    """A stable text key of a resolved config: equal configs, equal keys (what --resume and compare match).

    Fields at the value that records made before they existed imply are left out, so such records
    still match today's configs.
    """
    return json.dumps({k: v for k, v in config.items() if LATER_FIELDS.get(k, ...) != v}, sort_keys=True)


def recorded_keys(path: Path) -> set[str]:
    """Keys of the configs that already have a successful record (what --resume skips)."""
    if not path.exists():
        return set()
    return {config_key(r["config"]) for r in read_records(path) if r.get("status") == "ok"}
