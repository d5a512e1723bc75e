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
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from experiments.core.config import ConfigError
from experiments.core.records import SchemaError, config_key, read_records
from experiments.core.stats import paired_ratio, ratio_of_medians

MARKS = {"slower": "+", "faster": "-", "unchanged": " ", "not significant": "~"}
MIN_PAIRED_ROUNDS = 3  # fewer shared rounds than this: pool the samples instead


def pooled_samples(path: Path | list[dict]) -> dict[str, dict]:
    """Successful run records (a file, folder or list of records) by config key: the latency samples of
    repeated records pooled, and each tagged round's samples under (session, index)."""
    pooled: dict[str, dict] = {}
    for record in read_records(path) if isinstance(path, Path) else path:
        if record.get("kind") != "run" or record.get("status") != "ok":
            continue
        entry = pooled.setdefault(config_key(record["config"]),
                                  {"config": record["config"], "samples": [], "rounds": {}})
        entry["samples"].extend(record["latency_s"])
        if isinstance(record.get("round"), dict):
            tag = (record["round"]["session"], record["round"]["index"])
            entry["rounds"].setdefault(tag, []).extend(record["latency_s"])
    return pooled


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
            confidence: float = 0.99) -> list[dict]:
    """One row per config present in both: medians, ratio, its interval, how it was paired, the verdict."""
    before, after = pooled_samples(base), pooled_samples(new)
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
    except (ConfigError, SchemaError) as error:
        print(f"ddpbench compare: error: {error}", file=sys.stderr)
        return 2
    print(json.dumps(rows, indent=1) if args.json else format_table(rows))
    return 1 if any(row["verdict"] == "slower" for row in rows) else 0
