"""The record store: one JSON line per measured config (or all-reduce row, or training run).

Every record carries `schema_version`; readers refuse versions they do not know. Appends are one
`write` of a whole line to a file opened for appending, so a crash cannot interleave records.

A crash or a full disk can still leave a torn last line (a line without its newline). Readers skip it
with a warning, and it never counts as done; the next append sets it aside first, into `<file>.torn`
beside the file, so that a new record never continues a fragment. A write that fails (a full disk)
raises RecordWriteError and leaves the file as it was.

Readers are lenient by default: a line that is not a JSON object, anywhere in the file, is skipped
with a warning naming the file and line. `strict=True` (what the `compare` gate uses) refuses it
instead. Either way a record of an unknown schema_version is refused (SchemaError): it comes from
another ddpbench, and a report that silently left it out would look complete when it is not.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import warnings
from pathlib import Path
from typing import Iterator

SCHEMA_VERSION = 2  # 2: run records no longer store `breakdown_s` (derived from `phases_s` on loading)
READABLE_VERSIONS = (1, 2)
KINDS = ("run", "allreduce", "train", "profile", "interference")
# The phases of an iteration a run record times (`phases_s`), in their order within the iteration.
RUN_PHASES = ("forward", "backward", "exposed_comm", "optimizer")
TAIL_CHUNK = 1 << 16  # how far back to look at once for the last newline (a record can be megabytes)


class RecordError(ValueError):
    """A record file that cannot be read as records (raised by strict readers; lenient ones skip)."""


class SchemaError(RecordError):
    """A record file written by an incompatible version of ddpbench."""


class RecordWriteError(OSError):
    """A record could not be appended (a full disk, a size limit, an I/O error); the file is as before."""


class RecordWarning(UserWarning):
    """Something in a record file was skipped or set aside; shown as one line."""


def show_record_warnings_as_lines() -> None:
    """Print RecordWarnings as one line naming the record file (`ddpbench: warning: FILE:LINE: ...`),
    without the reader's source line; other warnings as before. The command line calls it once."""
    other = warnings.formatwarning

    def one_line(message, category, filename, lineno, line=None):
        if issubclass(category, RecordWarning):
            return f"ddpbench: warning: {message}\n"
        return other(message, category, filename, lineno, line)

    if getattr(warnings.formatwarning, "__name__", "") != "one_line":
        warnings.formatwarning = one_line


def append_record(path: Path, record: dict) -> None:
    """Append `record` as one line, in one write call (more only after a short one), and flush it to disk.

    A torn last line is set aside first (see `set_aside_torn_tail`). On any failure to write, the file
    is truncated back to where it was and RecordWriteError says why.
    """
    line = (json.dumps({"schema_version": SCHEMA_VERSION, **record}, allow_nan=False) + "\n").encode()
    try:
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError as error:
        raise _write_error(path, error) from error
    try:
        # One writer at a time: another ddpbench's line in flight must not look torn to this one.
        fcntl.flock(fd, fcntl.LOCK_EX)
        start = os.fstat(fd).st_size
        try:
            start = set_aside_torn_tail(fd, Path(path))
            remaining = memoryview(line)
            while remaining:  # a short write (the disk filling up) is followed by one that says why
                written = os.write(fd, remaining)
                if written <= 0:
                    raise OSError(errno.EIO, f"wrote {written} bytes")
                remaining = remaining[written:]
            os.fsync(fd)
        except OSError as error:
            try:
                os.ftruncate(fd, start)  # no partial line left behind for the next append to continue
            except OSError:
                pass
            raise _write_error(path, error) from error
    finally:
        os.close(fd)


def _write_error(path: Path, error: OSError) -> RecordWriteError:
    """A one-line RecordWriteError for `error` (its errno kept), naming the file."""
    failure = RecordWriteError(f"cannot write the record to {path}: {error.strerror or error}")
    failure.errno = error.errno
    return failure


def set_aside_torn_tail(fd: int, path: Path) -> int:
    """If the file open at `fd` does not end in a newline, end it at its last complete line; returns its size.

    A fragment that is a whole JSON object (a line that only lost its newline) is kept and given its
    newline. Any other fragment is appended to `<path>.torn` (kept, for whoever wants to look) and cut
    off, with a warning; what was written before it stays as it was.
    """
    size = os.fstat(fd).st_size
    if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
        return size
    end = size  # find the last newline, reading backwards
    while end > 0:
        begin = max(0, end - TAIL_CHUNK)
        found = os.pread(fd, end - begin, begin).rfind(b"\n")
        if found >= 0:
            end = begin + found + 1
            break
        end = begin
    fragment = os.pread(fd, size - end, end)
    if _json_object(fragment) is not None:
        os.write(fd, b"\n")
        return size + 1
    torn = path.with_name(path.name + ".torn")
    with open(torn, "ab") as kept:  # kept first, then cut: the fragment is never lost on the way
        kept.write(fragment + b"\n")
        kept.flush()
        os.fsync(kept.fileno())
    os.ftruncate(fd, end)
    warnings.warn(f"{path} ended in a torn line ({len(fragment)} bytes, from an interrupted write); moved it to "
                  f"{torn} before appending", RecordWarning, stacklevel=3)
    return end


_NOT_JSON = object()


def _json_value(line: bytes):
    """The JSON value on `line`, or _NOT_JSON."""
    try:
        return json.loads(line)
    except (ValueError, UnicodeDecodeError):
        return _NOT_JSON


def _json_object(line: bytes) -> dict | None:
    """The JSON object on `line`, or None if it is not one."""
    value = _json_value(line)
    return value if isinstance(value, dict) else None


def numbered_records(path: Path | str, strict: bool = False) -> Iterator[tuple[Path, int, dict]]:
    """(file, line number, record) for every record of a JSON-lines file, or of every *.jsonl under a folder.

    A torn last line is skipped with a warning. Any other line that is not a JSON object is skipped with
    a warning naming file and line, or with `strict` raises RecordError. A record of a schema_version
    this ddpbench does not read (or none) raises SchemaError.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no record file or folder at {path}")
    files = sorted(path.rglob("*.jsonl")) if path.is_dir() else [path]
    for file in files:
        lines = file.read_bytes().split(b"\n")
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            record = _json_object(line)
            if record is None:
                if number == len(lines):  # the last line, without its newline: torn by a crash
                    warnings.warn(f"{file}:{number}: skipping a torn last line", RecordWarning, stacklevel=2)
                    continue
                what = "not JSON" if _json_value(line) is _NOT_JSON else "JSON but not an object"
                if strict:
                    raise RecordError(f"{file}:{number}: not a record ({what})")
                warnings.warn(f"{file}:{number}: skipping an unreadable line ({what})", RecordWarning, stacklevel=2)
                continue
            version = record.get("schema_version")
            if version not in READABLE_VERSIONS:
                raise SchemaError(
                    f"{file}:{number}: schema_version {version!r}, but this ddpbench reads versions "
                    f"{' and '.join(map(str, READABLE_VERSIONS))}; re-run the measurement or use the "
                    "ddpbench that wrote it"
                )
            yield file, number, record


def read_records(path: Path | str, strict: bool = False) -> list[dict]:
    """Every record in a JSON-lines file, or in every *.jsonl file under a folder (see numbered_records)."""
    return [record for _file, _number, record in numbered_records(path, strict=strict)]


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
        row = {**LATER_FIELDS, **(record.get("config") or {}), "status": record.get("status")}
        # (version 1 records also store `breakdown_s`, by an older rule: left out)
        row.update({f"{k}": v for k, v in record.items() if k not in ("config", "summary", "breakdown_s", "env")})
        row.update({f"summary_{k}": v for k, v in (record.get("summary") or {}).items()})
        # the largest rank's peak over the measured iterations (records before it existed: None)
        row["peak_memory_mb"] = (record.get("memory") or {}).get("peak_mb")
        if record.get("phases_s"):  # derived from the raw samples, so that old records follow the same rule
            medians = phase_medians(record["phases_s"], (record.get("config") or {}).get("sync_every", 1))
            row.update({f"{phase}_s": v for phase, v in medians.items()})
        row.update({f"env_{k}": v for k, v in (record.get("env") or {}).items()})
        rows.append(row)
    return pd.DataFrame(rows)


# Config fields added after records were first stored, with the value every older record implies.
LATER_FIELDS = {"link": "none", "ranks_per_host": 1, "compute": "real", "compute_profile": "", "time_dilation": 1.0,
                "model_config": "", "amp": "none", "model_hash": "", "find_unused_parameters": False,
                "static_graph": False, "bucket_view": False, "compile": "none", "powersgd_rank": 1}


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
    return {config_key(r["config"]) for r in read_records(path)
            if r.get("status") == "ok" and isinstance(r.get("config"), dict)}
