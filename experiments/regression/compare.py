"""`ddpbench compare BASE NEW`: did per-iteration latency change between two sets of records?

Configs are matched by their resolved config. For each config, the ratio NEW/BASE with a confidence
interval (99% by default, as asv uses):
- paired, when both sides hold the same rounds of one A/B session (records that `ab` and `history`
  tag with `"round": {"session": ..., "index": ...}`, BASE and NEW run back to back in each round):
  the geometric mean of the per-round ratios of medians, with a t interval over rounds
  (stats.paired_ratio);
- otherwise pooled: all records of the config pool their raw samples; the ratio of medians with a
  bootstrap interval (stats.ratio_of_medians). That interval sees only the noise between iterations,
  not the larger one between runs: compare single runs only from a quiet machine, or use `ab`.
The verdict:
- slower / faster: paired, as `asv compare` marks it: the ratio is beyond the threshold (default 5%)
  and significant (the interval excludes 1); pooled, the whole interval lies beyond the threshold
  (a margin for the noise between runs that a pooled interval does not see);
- unchanged: the whole interval lies within the threshold;
- not significant: anything else (too noisy to say).
Exit status: 1 if any config is slower, 0 otherwise, 2 on bad input.

Being a gate, compare reads strictly: a line that is not a record, or a successful run record without
`config` or `latency_s`, or with a latency that is not a finite number above 0, is bad input (exit 2,
naming file and line), never skipped, since a verdict from what is left could pass a slowdown. Only a
torn last line (a crash's) is skipped with a warning, as every reader does.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import warnings
from pathlib import Path

from experiments.core.config import ConfigError
from experiments.core.records import RecordError, RecordWarning, config_key, numbered_records
from experiments.core.stats import paired_ratio, ratio_of_medians

MARKS = {"slower": "+", "faster": "-", "unchanged": " ", "not significant": "~"}
MIN_PAIRED_ROUNDS = 3  # fewer shared rounds than this: pool the samples instead


def pooled_samples(path: Path | list[dict], strict: bool = True) -> dict[str, dict]:
    """Successful run records (a file, folder or list of records) by config key: the latency samples of
    repeated records pooled, and each tagged round's samples under (session, index).

    `strict` (the gate): a line that is not a record, or a run record that cannot be compared (see
    `problem`), raises RecordError naming file and line. Otherwise (history's table) it is skipped with
    a warning. A torn last line is skipped with a warning either way.
    """
    pooled: dict[str, dict] = {}
    numbered = numbered_records(path, strict=strict) if isinstance(path, Path) else \
        (("the records", number, record) for number, record in enumerate(path, start=1))
    for file, number, record in numbered:
        wrong = problem(record)
        if wrong is not None:
            if strict:
                raise RecordError(f"{file}:{number}: {wrong}")
            warnings.warn(f"{file}:{number}: skipping a record that cannot be compared: {wrong}", RecordWarning,
                          stacklevel=2)
            continue
        if record.get("kind") != "run" or record.get("status") != "ok":
            continue
        entry = pooled.setdefault(config_key(record["config"]),
                                  {"config": record["config"], "samples": [], "rounds": {}})
        entry["samples"].extend(record["latency_s"])
        if isinstance(record.get("round"), dict):
            tag = (record["round"]["session"], record["round"]["index"])
            entry["rounds"].setdefault(tag, []).extend(record["latency_s"])
    return pooled


# What the table names a config by (see describe): a record must have them to be compared.
NAMED_FIELDS = ("model", "impl", "backend", "world_size", "bucket_mb", "sync_every", "process_groups", "comm_hook")


def problem(record) -> str | None:
    """Why a record cannot be compared (a successful run record with a missing or impossible field), or None.

    Records of other kinds, and failed runs, are not compared, so only their `kind` is checked.
    """
    if not isinstance(record, dict):
        return "not a JSON object"
    if not isinstance(record.get("kind"), str):
        return "no `kind`"
    if record["kind"] != "run" or record.get("status") != "ok":
        return None
    config = record.get("config")
    if not isinstance(config, dict):
        return "a successful run record without `config`"
    missing = [field for field in NAMED_FIELDS if field not in config]
    if missing:
        return f"`config` lacks {', '.join(missing)}"
    latency = record.get("latency_s")
    if not isinstance(latency, list) or not latency:
        return "a successful run record without `latency_s` samples"
    for i, value in enumerate(latency):
        # (bool is an int to Python, and no latency)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"latency_s[{i}] is {value!r}, not a number"
        if not math.isfinite(value) or value <= 0:
            return f"latency_s[{i}] is {value!r}; a latency must be a finite number of seconds above 0"
    tag = record.get("round")
    if tag is not None and not (isinstance(tag, dict) and "session" in tag and "index" in tag):
        return f"`round` is {tag!r}, not {{\"session\": ..., \"index\": ...}}"
    return None


def compare_samples(a: dict, b: dict, threshold: float, confidence: float) -> dict:
    """One config's row from its BASE and NEW entries (see pooled_samples): paired when they share
    enough rounds of one session, pooled otherwise."""
    shared = sorted(set(a["rounds"]) & set(b["rounds"]))
    if len(shared) >= MIN_PAIRED_ROUNDS:
        r = paired_ratio([b["rounds"][t] for t in shared], [a["rounds"][t] for t in shared], confidence)
        method = f"paired x{len(shared)}"
    else:
        r = ratio_of_medians(b["samples"], a["samples"], confidence=confidence)
        method = "pooled"
    return {"config": a["config"], "base_p50_s": _median(a["samples"]), "new_p50_s": _median(b["samples"]),
            "ratio": r["ratio"], "ci": r["ci"], "confidence": confidence, "method": method,
            "round_ratios": r.get("round_ratios"),
            "n_base": len(a["samples"]), "n_new": len(b["samples"]),
            "verdict": verdict(r["ratio"], r["ci"], threshold, paired=method != "pooled")}


def verdict(ratio: float, ci: list[float], threshold: float, paired: bool) -> str:
    """Classify a ratio NEW/BASE and its confidence interval against the threshold (see the top)."""
    low, high = ci
    significant = (low > 1, high < 1) if paired else (low > 1 + threshold, high < 1 / (1 + threshold))
    if ratio > 1 + threshold and significant[0]:
        return "slower"
    if ratio < 1 / (1 + threshold) and significant[1]:
        return "faster"
    if low >= 1 / (1 + threshold) and high <= 1 + threshold:
        return "unchanged"
    return "not significant"


def compare(base: Path | list[dict], new: Path | list[dict], threshold: float = 0.05,
            confidence: float = 0.99, strict: bool = True) -> list[dict]:
    """One row per config present in both: medians, ratio, its interval, how it was paired, the verdict.

    `strict` (the gate's default) refuses records it cannot trust (RecordError); see pooled_samples.
    """
    before, after = pooled_samples(base, strict), pooled_samples(new, strict)
    common = sorted(set(before) & set(after))
    if not common:
        names = [str(side) if isinstance(side, Path) else "the records" for side in (base, new)]
        raise ConfigError(f"no successful run configs in common between {names[0]} ({len(before)} configs) and "
                          f"{names[1]} ({len(after)} configs)")
    rows = [compare_samples(before[key], after[key], threshold, confidence) for key in common]
    return sorted(rows, key=lambda row: -row["ratio"])


def _median(samples: list[float]) -> float:
    ordered = sorted(samples)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def describe(config: dict) -> str:
    """A short name for a config in the table."""
    return (f"{config['model']} {config['impl']} {config['backend']} ws{config['world_size']} "
            f"b{config['bucket_mb']:g} n{config['sync_every']} pg{config['process_groups']} {config['comm_hook']}")


def format_table(rows: list[dict]) -> str:
    """An asv-compare-like table: mark, before, after, ratio [interval], method, config."""
    lines = [f"{'':1} {'before':>10} {'after':>10} {'ratio':>7} {'interval':>17} {'method':>10}  config"]
    for row in rows:
        lines.append(f"{MARKS[row['verdict']]:1} {row['base_p50_s'] * 1e3:>8.2f}ms {row['new_p50_s'] * 1e3:>8.2f}ms "
                     f"{row['ratio']:>7.3f} [{row['ci'][0]:.3f}, {row['ci'][1]:.3f}] {row['method']:>10}  "
                     f"{describe(row['config'])}")
    lines.append("marks: + slower, - faster, ~ not significant (too noisy to say); paired xN: over N paired rounds "
                 "(blocks of turns when interleaved)")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `compare` sub-command's options."""
    parser.add_argument("base", type=Path, help="record file or folder: before")
    parser.add_argument("new", type=Path, help="record file or folder: after")
    parser.add_argument("--threshold", type=float, default=0.05, help="relative change that counts (default 0.05)")
    parser.add_argument("--confidence", type=float, default=0.99, help="confidence level of the interval")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")


def check_verdict_options(threshold: float, confidence: float) -> None:
    """Raise ConfigError unless --threshold and --confidence are usable (compare, ab and history share them)."""
    if not 0 < threshold < 1:
        raise ConfigError(f"--threshold={threshold} is not allowed; it must be between 0 and 1")
    if not 0.5 < confidence < 1:
        raise ConfigError(f"--confidence={confidence} is not allowed; it must be between 0.5 and 1")


def main(args: argparse.Namespace) -> int:
    """Run the comparison; 1 if anything is slower, 2 on bad input."""
    try:
        check_verdict_options(args.threshold, args.confidence)
        for name in ("base", "new"):
            if not getattr(args, name).exists():
                raise ConfigError(f"{name}: {str(getattr(args, name))!r} does not exist")
        rows = compare(args.base, args.new, args.threshold, args.confidence)
    except (ConfigError, RecordError) as error:  # (RecordError includes SchemaError)
        print(f"ddpbench compare: error: {error}", file=sys.stderr)
        return 2
    print(json.dumps(rows, indent=1) if args.json else format_table(rows))
    return 1 if any(row["verdict"] == "slower" for row in rows) else 0
