"""`run --dry-run`: the grid's configs, one line each, with the time each would take where this machine's
records allow an estimate; nothing is measured and no process starts.

An estimate comes only from records of this machine (their `env.machine_id`): another machine's times
say nothing of this one's. They are read from `--out`, this machine's folder, and its timing log
(timing_log.py: every successful config `run` measured here, whatever its `--out`); one measurement
found in several of them counts once. A record of the same config gives its wall time; one that differs
only in iterations (`iters`, `warmup`) or in fields that do not change the work (`seed`, `reps`) gives
its build time, plus its warm-up and measured times scaled to the asked iterations, plus its overhead.
The median over such records is shown. A config that starts a set of ranks runs twice, as `run` does
(fresh ranks run their first config once unrecorded: sweep.run_jobs), and is estimated so; the ranks'
own start-up (a few seconds per set) is in no record and is said, not estimated.
"""
from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path

from experiments.core.machine import runs_folder, this_machine
from experiments.core.records import SchemaError, config_key, read_records, recorded_keys
from experiments.measure import timing_log
from experiments.measure.sweep import config_text, varying_fields

# Fields that change how long a config runs in proportion (iterations), or not at all.
SCALED = ("iters", "warmup")
IGNORED = ("seed", "reps")


def this_machines_records(paths: list[Path]) -> list[dict]:
    """The successful run records with timings among `paths` (files or folders) that this machine made;
    unreadable files are passed over (a plan must not fail on them)."""
    mine = this_machine()["id"]
    found = []
    for path in paths:
        if not path.exists():
            continue
        try:
            records = read_records(path)
        except (SchemaError, OSError, ValueError):
            continue
        found += [r for r in records if r.get("kind") == "run" and r.get("status") == "ok"
                  and (r.get("env") or {}).get("machine_id") == mine and isinstance(r.get("timing"), dict)
                  and isinstance(r.get("config"), dict)]
    return found


def once_each(records: list[dict]) -> list[dict]:
    """`records` with each measurement once: the same config with the same timings, found in --out, in this
    machine's folder and in its timing log, is one record."""
    seen, kept = set(), []
    for record in records:
        t = record["timing"]
        key = (config_key(record["config"]), *(t.get(k) for k in timing_log.TIMING_FIELDS))
        if key not in seen:
            seen.add(key)
            kept.append(record)
    return kept


def _shape(config: dict) -> str:
    """The key of a config with the iteration and unimportant fields left out."""
    return config_key({k: v for k, v in config.items() if k not in SCALED + IGNORED})


def estimate(config: dict, records: list[dict]) -> tuple[float, int] | None:
    """Estimated wall seconds of `config` and how many records it rests on; None without a like record."""
    shape, seconds = _shape(config), []
    for record in records:
        done = record["config"]
        if _shape(done) != shape:
            continue
        t = record["timing"]
        try:
            wall, setup, warmup, measured = t["config_wall_s"], t["setup_s"], t["warmup_s"], t["measured_s"]
        except KeyError:
            continue
        if done.get("iters", 0) <= 0:
            continue
        overhead = max(0.0, wall - setup - warmup - measured)  # gathering, recording, the ranks' start-up
        warm = warmup * config["warmup"] / done["warmup"] if done.get("warmup") else 0.0
        seconds.append(setup + warm + measured * config["iters"] / done["iters"] + overhead)
    return (statistics.median(seconds), len(seconds)) if seconds else None


def duration(seconds: float) -> str:
    """`seconds` as a person reads it: 4.2 s, 3.5 min, 1.2 h."""
    if seconds < 90:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.1f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


def plan(configs: list, out: Path, resume: bool) -> list[str]:
    """The lines of `run --dry-run`: one per config, with its estimate or why there is none, then a
    total. Records are read from `out`, this machine's folder and its timing log."""
    varying = varying_fields(configs)
    records = once_each(this_machines_records([out, runs_folder()]) + timing_log.read(this_machine()["id"]))
    done = recorded_keys(out) if resume and out.exists() else set()
    lines, total, estimated, skipped, pools, pool = [], 0.0, 0, 0, 0, None
    for number, config in enumerate(configs, 1):
        fields = dataclasses.asdict(config)
        head = f"[{number}/{len(configs)}] {config_text(fields, varying)}"
        if config_key(fields) in done:
            lines.append(f"{head}: skipped (already recorded in {out}; --resume)")
            skipped += 1
            continue
        fresh = pool_key(fields) != pool
        pool, pools = pool_key(fields), pools + fresh
        guess = estimate(fields, records)
        if guess is None:
            lines.append(f"{head}: no estimate (no record of a like config from this machine)")
            continue
        seconds, count = guess
        seconds *= 2 if fresh else 1
        total += seconds
        estimated += 1
        lines.append(f"{head}: about {duration(seconds)} (from {count} record{'s' * (count != 1)} of this machine"
                     + ("; run twice: fresh ranks run their first config once unrecorded" if fresh else "") + ")")
    todo = len(configs) - skipped
    lines.append(f"ddpbench run --dry-run: {todo} config(s) to measure, {skipped} skipped; about {duration(total)} "
                 f"for the {estimated} with an estimate" + (f", {todo - estimated} without" if todo > estimated else "")
                 + (f", plus starting {pools} set(s) of ranks (seconds each, not estimated)" if pools else "")
                 + f" (machine {this_machine()['name']}); nothing was run")
    return lines


def pool_key(fields: dict) -> tuple:
    """What makes `run` start a new set of ranks between two configs (sweep.run_jobs groups by it)."""
    return (fields["backend"], fields["device"], fields["world_size"], fields["threads"], fields["link"],
            fields["ranks_per_host"], fields.get("time_dilation", 1.0))
