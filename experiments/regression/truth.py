"""Ground truth: how much slower a commit really is, measured apart from the gate.

Many rounds; in each, every entry (a commit, run with the preset in fresh processes) runs once, in
an order shuffled anew each round, so that drift of the machine and the position in a round hit
every entry alike. The true size of entry X against entry B is the geometric mean over rounds of
median(X)/median(B), with a 95% t interval over rounds (compare's paired ratio). Two entries of the
same commit ("base" and "null") give the spread of a same-against-same ratio under the same design.

A round runs under the measurement lock (if given) and its records are appended only once the whole
round has finished, so an interrupted session resumes at the first unfinished round.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from ..records import append_record, read_records
from .ab import QUIET, run_round, worktrees
from .compare import compare

TRUTH_CONFIDENCE = 0.95


@contextlib.contextmanager
def measurement_lock(path: str | None):
    """Hold an exclusive flock on `path` (the lock `flock(1)` takes too); nothing if `path` is empty."""
    if not path:
        yield
        return
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def rounds_done(folder: Path, names: list[str]) -> int:
    """How many whole rounds `folder` holds for every entry (rounds are appended whole)."""
    counts = [len({r["round"]["index"] for r in read_records(folder / f"{n}.jsonl") if r.get("kind") == "run"})
              if (folder / f"{n}.jsonl").exists() else 0 for n in names]
    return min(counts, default=0)


def interleave(repo: Path, entries: dict[str, tuple[str, bool]], preset: str, rounds: int, folder: Path,
               lock: str | None = None, seed: int = 0) -> None:
    """Run every entry (name -> (commit, each model in processes of its own?)) once per round, shuffled,
    until `folder` holds `rounds` whole rounds; records go to folder/<name>.jsonl."""
    names = list(entries)
    session_file = folder / "session.json"
    if session_file.exists():
        check_session(session_file, entries)
    start = rounds_done(folder, names)
    if start >= rounds:
        return
    folder.mkdir(parents=True, exist_ok=True)
    if not session_file.exists():
        session_file.write_text(json.dumps({"session": f"truth-{time.strftime('%Y%m%dT%H%M%S')}", "preset": preset,
                                            "entries": entries}) + "\n")
    session = json.loads(session_file.read_text())["session"]
    commits = {commit for commit, _ in entries.values()}
    with tempfile.TemporaryDirectory(prefix="ddpbench-truth-") as tmp:
        with worktrees(repo, {c: c for c in commits}, Path(tmp)) as trees:
            for index in range(start, rounds):
                order = random.Random(f"{session}-{seed}-{index}").sample(names, len(names))
                staged = Path(tmp) / f"round-{index}"
                staged.mkdir()
                started = time.monotonic()
                with measurement_lock(lock):
                    for name in order:
                        commit, separate = entries[name]
                        error = run_round(trees[commit], preset, staged / f"{name}.jsonl",
                                          {"session": session, "index": index}, separate=separate)
                        if error:
                            raise RuntimeError(f"truth: {name} ({commit[:10]}) cannot run the {preset} preset: {error}")
                for name in names:  # the whole round, or nothing
                    for record in read_records(staged / f"{name}.jsonl"):
                        append_record(folder / f"{name}.jsonl", record)
                print(f"truth {preset} round {index + 1}/{rounds}: {len(names)} runs in "
                      f"{time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)


def check_session(session_file: Path, entries: dict[str, tuple[str, bool | None]]) -> None:
    """Raise RuntimeError unless the recorded session ran exactly these entries on these commits."""
    recorded = json.loads(session_file.read_text())
    if {n: c[0] for n, c in recorded["entries"].items()} != {n: c for n, (c, _) in entries.items()}:
        # Rounds of other entries (or other commits) cannot be completed by these: they would mix two designs.
        raise RuntimeError(f"truth: {session_file.parent} holds rounds of other entries or commits ({session_file}); give the "
                           "drill another --out, or the same --base and regressions")


def true_sizes(folder: Path, pairs: dict[str, tuple[str, str]]) -> dict[str, dict[str, dict]]:
    """label -> config model -> ratio, 95% interval, rounds, per-round ratios and their spread (the
    standard deviation of the log ratios), for each (numerator, denominator) entry pair."""
    sizes: dict[str, dict[str, dict]] = {}
    for label, (numerator, denominator) in pairs.items():
        rows = compare(folder / f"{denominator}.jsonl", folder / f"{numerator}.jsonl", 0.05, TRUTH_CONFIDENCE)
        load = {**round_loads(folder / f"{denominator}.jsonl")}
        for index, value in round_loads(folder / f"{numerator}.jsonl").items():
            load[index] = max(load.get(index, 0.0), value)
        sizes[label] = {}
        for row in rows:
            ratios = row["round_ratios"] or []
            loads = [load.get(i) for i in sorted(load)][:len(ratios)]  # compare orders rounds by index too
            quiet = [r for r, other in zip(ratios, loads) if other is not None and other <= QUIET]
            sizes[label][row["config"]["model"]] = {
                "ratio": row["ratio"], "ci": row["ci"], "rounds": len(ratios), "round_ratios": ratios,
                "round_other_load": loads, "base_p50_ms": row["base_p50_s"] * 1e3, "spread": _spread(ratios),
                # the same, over the rounds in which no other process kept more than QUIET cores busy
                "quiet_rounds": len(quiet), "quiet_spread": _spread(quiet),
            }
    return sizes


def round_loads(path: Path) -> dict[int, float]:
    """Round index -> the cores other processes kept busy during that round's run (the most of its records)."""
    loads: dict[int, float] = {}
    for record in read_records(path):
        other = record.get("round", {}).get("other_load")
        if other is not None:
            loads[record["round"]["index"]] = max(loads.get(record["round"]["index"], 0.0), other)
    return loads


def _spread(ratios: list[float]) -> float | None:
    """The standard deviation of the log ratios (about the relative spread), None for fewer than 2."""
    return float(np.std(np.log(ratios), ddof=1)) if len(ratios) > 1 else None
