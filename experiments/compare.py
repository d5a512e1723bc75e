"""`ddpbench compare BASE NEW`: did per-iteration latency change between two sets of records?

Configs are matched by their resolved config; records of the same config (several rounds of an A/B
run) pool their raw samples. For each config: the ratio of medians NEW/BASE with a bootstrap
confidence interval (99% by default, as asv uses), and a verdict:
- slower / faster: the whole interval lies beyond the threshold (default 5%) on that side;
- unchanged: the whole interval lies within the threshold;
- not significant: anything else (too noisy to say).
Exit status: 1 if any config is slower, 0 otherwise, 2 on bad input.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .config import ConfigError
from .records import SchemaError, config_key, read_records
from .stats import ratio_of_medians

MARKS = {"slower": "+", "faster": "-", "unchanged": " ", "not significant": "~"}


def pooled_samples(path: Path) -> dict[str, dict]:
    """Successful run records by config key, with the latency samples of repeated records pooled."""
    pooled: dict[str, dict] = {}
    for record in read_records(path):
        if record.get("kind") != "run" or record.get("status") != "ok":
            continue
        entry = pooled.setdefault(config_key(record["config"]), {"config": record["config"], "samples": []})
        entry["samples"].extend(record["latency_s"])
    return pooled


def verdict(ci: list[float], threshold: float) -> str:
    """Classify a confidence interval of NEW/BASE against the threshold."""
    low, high = ci
    if low > 1 + threshold:
        return "slower"
    if high < 1 / (1 + threshold):
        return "faster"
    if low >= 1 / (1 + threshold) and high <= 1 + threshold:
        return "unchanged"
    return "not significant"


def compare(base: Path, new: Path, threshold: float = 0.05, confidence: float = 0.99) -> list[dict]:
    """One row per config present in both: medians, ratio, its interval and the verdict."""
    before, after = pooled_samples(base), pooled_samples(new)
    common = sorted(set(before) & set(after))
    if not common:
        raise ConfigError(f"no successful run configs in common between {base} ({len(before)} configs) and "
                          f"{new} ({len(after)} configs)")
    rows = []
    for key in common:
        a, b = before[key]["samples"], after[key]["samples"]
        r = ratio_of_medians(b, a, confidence=confidence)
        rows.append({"config": before[key]["config"], "base_p50_s": _median(a), "new_p50_s": _median(b),
                     "ratio": r["ratio"], "ci": r["ci"], "confidence": confidence,
                     "n_base": len(a), "n_new": len(b), "verdict": verdict(r["ci"], threshold)})
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
    """An asv-compare-like table: mark, before, after, ratio [interval], config."""
    lines = [f"{'':1} {'before':>10} {'after':>10} {'ratio':>7} {'interval':>17}  config"]
    for row in rows:
        lines.append(f"{MARKS[row['verdict']]:1} {row['base_p50_s'] * 1e3:>8.2f}ms {row['new_p50_s'] * 1e3:>8.2f}ms "
                     f"{row['ratio']:>7.3f} [{row['ci'][0]:.3f}, {row['ci'][1]:.3f}]  {describe(row['config'])}")
    lines.append("marks: + slower, - faster, ~ not significant (interval straddles the threshold)")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `compare` sub-command's options."""
    parser.add_argument("base", type=Path, help="record file or folder: before")
    parser.add_argument("new", type=Path, help="record file or folder: after")
    parser.add_argument("--threshold", type=float, default=0.05, help="relative change that counts (default 0.05)")
    parser.add_argument("--confidence", type=float, default=0.99, help="confidence level of the interval")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")


def main(args: argparse.Namespace) -> int:
    """Run the comparison; 1 if anything is slower, 2 on bad input."""
    try:
        if not 0 < args.threshold < 1:
            raise ConfigError(f"--threshold={args.threshold} is not allowed; it must be between 0 and 1")
        if not 0.5 < args.confidence < 1:
            raise ConfigError(f"--confidence={args.confidence} is not allowed; it must be between 0.5 and 1")
        for name in ("base", "new"):
            if not getattr(args, name).exists():
                raise ConfigError(f"{name}: {str(getattr(args, name))!r} does not exist")
        rows = compare(args.base, args.new, args.threshold, args.confidence)
    except (ConfigError, SchemaError) as error:
        print(f"ddpbench compare: error: {error}", file=sys.stderr)
        return 2
    print(json.dumps(rows, indent=1) if args.json else format_table(rows))
    return 1 if any(row["verdict"] == "slower" for row in rows) else 0
