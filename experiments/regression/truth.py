"""Ground truth: how much slower a commit really is, measured apart from the gate.

Many rounds; in each, every entry (a commit) runs once, and the true size of entry X against entry B
is the geometric mean over rounds of each round's ratio X/B, with a 95% t interval over rounds. Two
entries of the same commit ("base" and "null") give the spread of a same-against-same ratio under the
same design. Two designs of a round:

- `in_processes` (the drill's truth): a fresh set of processes in which every entry's ddp_core runs
  interleaved iteration by iteration (interleaved.py) for a while; the round's ratio is its paired
  ratio over blocks. Far longer than an A/B and with every regression at once, and the rounds are
  separate process sets, so a bias of one set (which replica came first, memory layout) shows as
  spread between rounds instead of hiding in the blocks.
- `interleave` (the noise trial): every entry runs the preset in fresh processes once, in an order
  shuffled anew each round; the round's ratio is median(X)/median(B).

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

from experiments.core.records import append_record, read_records
from experiments.core.stats import geometric_mean_ratio
from experiments.regression import interleaved
from experiments.regression.ab import PRESETS, QUIET, run_round, worktrees
from experiments.regression.compare import compare

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


def round_of(record: dict):
    """Which round a record belongs to: an interleaved round is a session of its own, whose blocks are
    its indices; otherwise one session holds the rounds as its indices."""
    tag = record["round"]
    return tag["session"] if tag.get("interleaved") else tag["index"]


def rounds_done(folder: Path, names: list[str]) -> int:
    """How many rounds `folder` holds for every entry (rounds are appended whole; a round that an
    interruption left in some entries' files only is not counted)."""
    held = [{round_of(r) for r in read_records(folder / f"{n}.jsonl") if r.get("kind") == "run"}
            if (folder / f"{n}.jsonl").exists() else set() for n in names]
    return len(set.intersection(*held)) if held else 0


def in_processes(repo: Path, entries: dict[str, str], preset: str, rounds: int, folder: Path,
                 lock: str | None = None, seconds: float | None = None) -> None:
    """Run every entry (name -> commit) interleaved in one fresh set of processes per round and config,
    for `seconds` (default: 3x the preset's A/B) of measured iterations each, until `folder` holds
    `rounds` whole rounds; records go to folder/<name>.jsonl."""
    seconds = seconds or 3 * PRESETS[preset]["seconds"]
    session, start = _start_session(folder, {n: (c, None) for n, c in entries.items()}, preset, "in_processes")
    if start >= rounds:
        return
    with tempfile.TemporaryDirectory(prefix="ddpbench-truth-") as tmp:
        with worktrees(repo, {c: c for c in set(entries.values())}, Path(tmp)) as trees:
            for index in range(start, rounds):
                staged, started = Path(tmp) / f"round-{index}", time.monotonic()
                with measurement_lock(lock):
                    # (names are shuffled per block inside; one set of processes holds them all, one replica
                    # each: the rounds' fresh processes average a replica's memory placement out)
                    try:  # a session name per attempt: a retried round never merges with a torn one
                        interleaved.run({n: trees[c] for n, c in entries.items()}, PRESETS[preset]["grid"], seconds,
                                        staged, f"{session}-round{index}-{time.strftime('%H%M%S')}")
                    except Exception as error:  # the drill reports it and keeps what is done
                        raise RuntimeError(f"truth: the {preset} preset cannot run interleaved "
                                           f"({type(error).__name__}): {error}") from error
                _append_round(staged, folder, list(entries))
                print(f"truth {preset} round {index + 1}/{rounds}: {len(entries)} entries interleaved in "
                      f"{time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)


def _start_session(folder: Path, entries: dict[str, tuple[str, bool | None]], preset: str,
                   design: str) -> tuple[str, int]:
    """The session of the rounds in `folder` (made if new; RuntimeError if of other entries or another
    design) and how many whole rounds it holds."""
    session_file = folder / "session.json"
    if session_file.exists():
        check_session(session_file, entries, design)
    folder.mkdir(parents=True, exist_ok=True)
    if not session_file.exists():
        session_file.write_text(json.dumps({"session": f"truth-{time.strftime('%Y%m%dT%H%M%S')}", "preset": preset,
                                            "design": design, "entries": entries}) + "\n")
    return json.loads(session_file.read_text())["session"], rounds_done(folder, list(entries))


def _append_round(staged: Path, folder: Path, names: list[str]) -> None:
    """Append a finished round's records (the whole round, or nothing)."""
    for name in names:
        for record in read_records(staged / f"{name}.jsonl"):
            append_record(folder / f"{name}.jsonl", record)


def interleave(repo: Path, entries: dict[str, tuple[str, bool]], preset: str, rounds: int, folder: Path,
               lock: str | None = None, seed: int = 0) -> None:
    """Run every entry (name -> (commit, each model in processes of its own?)) once per round, shuffled,
    until `folder` holds `rounds` whole rounds; records go to folder/<name>.jsonl."""
    names = list(entries)
    session, start = _start_session(folder, entries, preset, "interleave")
    if start >= rounds:
        return
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
                _append_round(staged, folder, names)
                print(f"truth {preset} round {index + 1}/{rounds}: {len(names)} runs in "
                      f"{time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)


def check_session(session_file: Path, entries: dict[str, tuple[str, bool | None]], design: str) -> None:
    """Raise RuntimeError unless the recorded session ran exactly these entries on these commits, in
    this design (`in_processes` or `interleave`; a session of neither says nothing: the first design)."""
    recorded = json.loads(session_file.read_text())
    if (recorded.get("design", "interleave") != design
            or {n: c[0] for n, c in recorded["entries"].items()} != {n: c for n, (c, _) in entries.items()}):
        # Rounds of other entries (or other commits) cannot be completed by these: they would mix two designs.
        raise RuntimeError(f"truth: {session_file.parent} holds rounds of other entries, commits or design ({session_file}); give the "
                           "drill another --out, or the same --base and regressions")


def true_sizes(folder: Path, pairs: dict[str, tuple[str, str]]) -> dict[str, dict[str, dict]]:
    """label -> config model -> ratio, 95% interval, rounds, per-round ratios and their spread (the
    standard deviation of the log ratios), for each (numerator, denominator) entry pair. A round's
    ratio is compare's: paired over the blocks of an interleaved round, median over median otherwise."""
    sizes: dict[str, dict[str, dict]] = {}
    for label, (numerator, denominator) in pairs.items():
        num, den = _by_round(folder / f"{numerator}.jsonl"), _by_round(folder / f"{denominator}.jsonl")
        per_model: dict[str, dict[str, list]] = {}
        for key in [k for k in den if k in num]:  # in the order measured
            loads = [r["round"].get("other_load") for r in num[key] + den[key]]
            load = None if None in loads or not loads else max(loads)
            for row in compare(den[key], num[key], 0.05, TRUTH_CONFIDENCE):
                entry = per_model.setdefault(row["config"]["model"], {"ratios": [], "loads": [], "base": []})
                entry["ratios"].append(row["ratio"])
                entry["loads"].append(load)
                entry["base"].append(row["base_p50_s"])
        sizes[label] = {}
        for model, entry in per_model.items():
            ratios, loads = entry["ratios"], entry["loads"]
            if len(ratios) < 2:
                continue  # no interval from one round
            whole = geometric_mean_ratio(ratios, TRUTH_CONFIDENCE)
            quiet = [r for r, other in zip(ratios, loads) if other is not None and other <= QUIET]
            sizes[label][model] = {
                "ratio": whole["ratio"], "ci": whole["ci"], "rounds": len(ratios), "round_ratios": ratios,
                "round_other_load": loads, "base_p50_ms": float(np.median(entry["base"])) * 1e3,
                "spread": _spread(ratios),
                # the same, over the rounds in which no other process kept more than QUIET cores busy
                "quiet_rounds": len(quiet), "quiet_spread": _spread(quiet),
            }
    return sizes


def _by_round(path: Path) -> dict:
    """An entry's successful run records, grouped by round (see round_of)."""
    rounds: dict = {}
    for record in read_records(path):
        if record.get("kind") == "run" and record.get("status") == "ok" and isinstance(record.get("round"), dict):
            rounds.setdefault(round_of(record), []).append(record)
    return rounds


def _spread(ratios: list[float]) -> float | None:
    """The standard deviation of the log ratios (about the relative spread), None for fewer than 2."""
    return float(np.std(np.log(ratios), ddof=1)) if len(ratios) > 1 else None
