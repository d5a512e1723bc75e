"""`ddpbench compare BASE NEW`: did per-iteration latency change between two sets of records?

Configs are matched by their resolved config. The unit of replication is the process launch (a record),
never an iteration: the iterations of one launch share what the next launch draws again (memory
placement, page faults, other load), so their spread says nothing of how far two launches stray. For
each config, the ratio NEW/BASE with a confidence interval (99% by default, as asv uses):
- `paired xN`, when both sides hold the same rounds of one A/B session (records that `ab` and
  `history` tag with `"round": {"session": ..., "index": ...}`, BASE and NEW run back to back in each
  round): the geometric mean of the per-round ratios of medians, a t interval over rounds
  (stats.paired_ratio);
- `launches AxB` otherwise: the ratio of the geometric means of each launch's median, a t interval
  whose launch-to-launch spread is pooled from the launches themselves and from this machine's stored
  drift (`ddpbench drift`; stats.launch_ratio). With one launch per side only the stored drift can say
  how far two launches stray: without it the row cannot tell (`~`, with the reason).
The verdict, as `asv compare` marks it: slower / faster when the ratio is beyond the threshold (default
5%) and significant after Holm's correction over the configs compared (family-wise, so that comparing
30 configs at 99% does not raise 30 chances of a false alarm); unchanged when the whole interval lies
within the threshold; not significant otherwise, with the reason. Exit status: 1 if any config is
slower, 0 otherwise, 2 on bad input.

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
from dataclasses import dataclass
from pathlib import Path

from experiments.core.config import ConfigError, cap_text
from experiments.core.records import RecordError, RecordWarning, config_key, numbered_records
from experiments.core.stats import holm, launch_ratio, paired_ratio
from experiments.core.drift import drift_file, stored_drift

MARKS = {"slower": "+", "faster": "-", "unchanged": " ", "not significant": "~"}
MIN_PAIRED_ROUNDS = 3  # fewer shared rounds than this: pool the samples instead


def pooled_samples(path: Path | list[dict], strict: bool = True) -> dict[str, dict]:
    """Successful run records (a file, folder or list of records) by config key: the latency samples of
    repeated records pooled, each record's (launch's) median, the machines (name, id) that made them, and
    each tagged round's samples under (session, index).

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
                                  {"config": record["config"], "samples": [], "rounds": {}, "launches": [],
                                   "machines": set()})
        entry["samples"].extend(record["latency_s"])
        entry["launches"].append(_median(record["latency_s"]))  # a record is one launch of its config
        env = record.get("env") if isinstance(record.get("env"), dict) else {}
        entry["machines"].add((env.get("machine"), env.get("machine_id")))
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


def compare_samples(a: dict, b: dict, confidence: float, drift: dict | None) -> dict:
    """One config's row from its BASE and NEW entries (see pooled_samples), before its verdict: paired
    when they share enough rounds of one session, else over launches (with the stored `drift`)."""
    shared = sorted(set(a["rounds"]) & set(b["rounds"]))
    reason = None
    if len(shared) >= MIN_PAIRED_ROUNDS:
        r = paired_ratio([b["rounds"][t] for t in shared], [a["rounds"][t] for t in shared], confidence)
        method = f"paired x{len(shared)}"
    else:
        r = launch_ratio(b["launches"], a["launches"], confidence, *(drift["sd"], drift["df"]) if drift else (None, 0))
        method = f"launches {len(a['launches'])}x{len(b['launches'])}"
        if r is None:
            r = {"ratio": _median(b["samples"]) / _median(a["samples"]), "ci": None, "p": None}
            reason = ("one launch each, and this machine's launch-to-launch drift is not measured (`ddpbench "
                      "drift`): the iterations of one launch cannot show how far two launches stray; measure "
                      "the drift, record several launches per side, or use `ab`")
        elif drift and min(len(a["launches"]), len(b["launches"])) == 1:
            method += " +drift"
            resolvable = r["ci"][1] / r["ratio"]  # the half-width of the interval, as a factor
            reason = (f"one launch on a side: within this machine's launch-to-launch drift of {drift['sd']:.1%} "
                      f"(sd of log medians over {drift['launches']} launches, {drift['file']}), which lets one "
                      f"launch a side tell only changes beyond {resolvable:.2f}x at {confidence:.0%}; use `ab`, "
                      "record more launches, or measure the drift over more launches")
    return {"config": a["config"], "base_p50_s": _median(a["samples"]), "new_p50_s": _median(b["samples"]),
            "ratio": r["ratio"], "ci": r["ci"], "p": r["p"], "confidence": confidence, "method": method,
            "round_ratios": r.get("round_ratios"), "launches": [len(a["launches"]), len(b["launches"])],
            "n_base": len(a["samples"]), "n_new": len(b["samples"]), "reason_if_unsure": reason}


def decide(rows: list[dict], threshold: float, confidence: float) -> None:
    """Give every row its verdict, with Holm's correction over the rows (family-wise error at
    1 - confidence): `p_holm`, `verdict`, and `reason` for one that cannot tell."""
    tested = [row for row in rows if row["p"] is not None]
    for row, adjusted in zip(tested, holm([row["p"] for row in tested])):
        row["p_holm"] = adjusted
    for row in rows:
        if row["ci"] is None:
            row["verdict"], row["reason"] = "not significant", row["reason_if_unsure"]
        else:
            row["verdict"] = verdict(row["ratio"], row["ci"], threshold, row["p_holm"] < 1 - confidence)
            row["reason"] = row["reason_if_unsure"] if row["verdict"] == "not significant" else None
            if row["verdict"] == "not significant" and row["reason"] is None:
                row["reason"] = (f"the {confidence:.0%} interval straddles the {threshold:.0%} threshold or 1"
                                 + (" after Holm's correction" if row["ci"][0] > 1 or row["ci"][1] < 1 else ""))
        del row["reason_if_unsure"]


def verdict(ratio: float, ci: list[float], threshold: float, significant: bool) -> str:
    """Classify a ratio NEW/BASE, its interval and whether it differs from 1 (after the family's correction)."""
    low, high = ci
    if ratio > 1 + threshold and significant and low > 1:
        return "slower"
    if ratio < 1 / (1 + threshold) and significant and high < 1:
        return "faster"
    if low >= 1 / (1 + threshold) and high <= 1 + threshold:
        return "unchanged"
    return "not significant"


def machine_drift(entries: list[dict], drift: Path | None) -> dict | None:
    """The launch-to-launch drift for these entries: from `drift` if given, else from the drift file of
    the one machine that made every record (None where they came from several or from none named)."""
    machines = set().union(*(entry["machines"] for entry in entries))
    if drift is not None:
        return stored_drift(drift)
    if len(machines) != 1 or None in next(iter(machines)):
        return None
    name, ident = next(iter(machines))
    return stored_drift(drift_file(name), ident)


def compare(base: Path | list[dict], new: Path | list[dict], threshold: float = 0.05,
            confidence: float = 0.99, strict: bool = True, drift: Path | None = None) -> list[dict]:
    """One row per config present in both: medians, ratio, its interval, how it was decided, the verdict.

    `strict` (the gate's default) refuses records it cannot trust (RecordError); see pooled_samples.
    `drift`: a drift file to use instead of the records' machine's (see drift.py).
    """
    before, after = pooled_samples(base, strict), pooled_samples(new, strict)
    common = sorted(set(before) & set(after))
    if not common:
        names = [str(side) if isinstance(side, Path) else "the records" for side in (base, new)]
        raise ConfigError(f"no successful run configs in common between {names[0]} ({len(before)} configs) and "
                          f"{names[1]} ({len(after)} configs)")
    if drift is not None and stored_drift(drift) is None:
        raise ConfigError(f"--drift={str(drift)!r} holds no drift session of two launches or more (`ddpbench drift`)")
    found = machine_drift([before[key] for key in common] + [after[key] for key in common], drift)
    rows = [compare_samples(before[key], after[key], confidence, found) for key in common]
    decide(rows, threshold, confidence)
    return sorted(rows, key=lambda row: -row["ratio"])


def _median(samples: list[float]) -> float:
    ordered = sorted(samples)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def describe(config: dict) -> str:
    """A short name for a config in the table."""
    return (f"{config['model']} {config['impl']} {config['backend']} ws{config['world_size']} "
            f"b{cap_text(config['bucket_mb'])} n{config['sync_every']} pg{config['process_groups']} {config['comm_hook']}")


def format_table(rows: list[dict]) -> str:
    """An asv-compare-like table: mark, before, after, ratio [interval], method, config; then the
    reason of each row that cannot tell, and how significance was decided."""
    lines = [f"{'':1} {'before':>10} {'after':>10} {'ratio':>7} {'interval':>17} {'method':>18}  config"]
    reasons = []
    for row in rows:
        interval = f"[{row['ci'][0]:.3f}, {row['ci'][1]:.3f}]" if row["ci"] else f"{'-':^16}"
        lines.append(f"{MARKS[row['verdict']]:1} {row['base_p50_s'] * 1e3:>8.2f}ms {row['new_p50_s'] * 1e3:>8.2f}ms "
                     f"{row['ratio']:>7.3f} {interval} {row['method']:>18}  {describe(row['config'])}")
        if row.get("reason"):
            reasons.append(f"~ {describe(row['config'])}: {row['reason']}")
    confidence = rows[0]["confidence"] if rows else 0.99
    lines += reasons
    lines.append("marks: + slower, - faster, ~ not significant (too noisy to say); paired xN: over N paired rounds "
                 "(blocks of turns when interleaved); launches AxB: t interval over A and B launches' medians "
                 f"(+drift: with this machine's stored drift); {confidence:.0%} intervals, significance by Holm's "
                 f"correction over the {len(rows)} config(s)")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `compare` sub-command's options."""
    parser.add_argument("base", type=Path, help="record file or folder: before")
    parser.add_argument("new", type=Path, help="record file or folder: after")
    parser.add_argument("--threshold", type=float, default=0.05, help="relative change that counts (default 0.05)")
    parser.add_argument("--confidence", type=float, default=0.99, help="confidence level of the interval")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    parser.add_argument("--drift", type=Path, help="a drift file (`ddpbench drift`) to use instead of the one of the "
                                                   "records' machine (results/runs/<machine>/drift.jsonl)")


@dataclass(frozen=True)
class CompareOptions:
    """What `ddpbench compare` is asked: two sets of records and how to judge them (its flags, typed)."""

    base: Path
    new: Path
    threshold: float = 0.05
    confidence: float = 0.99
    json: bool = False
    drift: Path | None = None


def check_verdict_options(threshold: float, confidence: float) -> None:
    """Raise ConfigError unless --threshold and --confidence are usable (compare, ab and history share them)."""
    if not 0 < threshold < 1:
        raise ConfigError(f"--threshold={threshold} is not allowed; it must be between 0 and 1")
    if not 0.5 < confidence < 1:
        raise ConfigError(f"--confidence={confidence} is not allowed; it must be between 0.5 and 1")


def main(options: CompareOptions) -> int:
    """Run the comparison; 1 if anything is slower, 2 on bad input."""
    try:
        check_verdict_options(options.threshold, options.confidence)
        for name in ("base", "new"):
            if not getattr(options, name).exists():
                raise ConfigError(f"{name}: {str(getattr(options, name))!r} does not exist")
        if options.drift is not None and not options.drift.is_file():
            raise ConfigError(f"--drift={str(options.drift)!r} does not exist")
        rows = compare(options.base, options.new, options.threshold, options.confidence, drift=options.drift)
    except (ConfigError, RecordError) as error:  # (RecordError includes SchemaError)
        print(f"ddpbench compare: error: {error}", file=sys.stderr)
        return 2
    print(json.dumps(rows, indent=1) if options.json else format_table(rows))
    return 1 if any(row["verdict"] == "slower" for row in rows) else 0
