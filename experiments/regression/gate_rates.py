"""The gate's false-alarm rate and power, from the drill's stored A/Bs.

Every A/B keeps each config's per-round ratios, so its verdict can be decided again under the gate as it
stands (compare's rule: the geometric mean of the round ratios beyond the threshold, its 99% t interval
above 1, significant after Holm's correction over the A/B's configs) and under other thresholds:
- the false-alarm rate: the share of same-against-same A/Bs that exit 1 (any config `slower`), with
  its exact (Clopper-Pearson) one-sided 95% upper bound: 0 of 100 bounds the rate at 3.0%, 0 of 300 at 1.0%;
- the power: per injected regression and config, the share of its A/Bs flagged, against the true size
  that the drill's truth step measured apart from the gate, binned at 1, 2, 3, 5 and 10%.
The A/Bs themselves come from `ddpbench drill --steps ab --same N` (resumable: it runs what the JSON lacks).
"""
from __future__ import annotations

import math

from experiments.core.stats import geometric_mean_ratio, holm

CONFIDENCE = 0.99  # ab's
SIZES = (0.01, 0.02, 0.03, 0.05, 0.10)  # the power curve's true sizes
EDGES = (0.005, 0.015, 0.025, 0.04, 0.075, 0.15)  # bin edges around them


def upper_bound(flagged: int, runs: int, confidence: float = 0.95) -> float:
    """The exact one-sided upper confidence bound of a rate seen `flagged` times in `runs`."""
    from scipy.stats import beta  # here: the command line imports this module (through drill) to parse options

    return 1.0 if flagged >= runs else float(beta.ppf(confidence, flagged + 1, runs - flagged))


def rejudge(ab: dict, threshold: float) -> dict[str, bool]:
    """Per config of one stored A/B: whether the gate flags it slower at `threshold` (see the top)."""
    rows = [row for row in ab.get("rows", []) if row.get("round_ratios") and len(row["round_ratios"]) >= 2]
    results = [geometric_mean_ratio(row["round_ratios"], CONFIDENCE) for row in rows]
    adjusted = holm([r["p"] for r in results])
    return {row["config"]: r["ratio"] > 1 + threshold and r["ci"][0] > 1 and p < 1 - CONFIDENCE
            for row, r, p in zip(rows, results, adjusted)}


def threshold_of(preset: dict) -> float:
    """The threshold the preset's A/Bs ran at (ab's default for its mode)."""
    return next((ab["threshold"] for ab in preset["abs"] if ab.get("threshold")), 0.03)


def false_alarms(preset: dict, threshold: float) -> dict:
    """Same-against-same A/Bs flagged at `threshold` (any config), with the 95% upper bound of the rate."""
    same = [rejudge(ab, threshold) for ab in preset["abs"] if ab["kind"] == "same" and "rows" in ab]
    flagged = sum(any(verdicts.values()) for verdicts in same)
    return {"runs": len(same), "flagged": flagged, "rate": flagged / len(same) if same else None,
            "upper_95": upper_bound(flagged, len(same)) if same else None}


def power(preset: dict, threshold: float) -> list[dict]:
    """Per regression and config: its true size (truth step) and the share of its A/Bs flagged at `threshold`."""
    points = []
    for name, sizes in preset.get("truth", {}).items():
        if name == "same":
            continue
        verdicts = [rejudge(ab, threshold) for ab in preset["abs"] if ab["kind"] == name and "rows" in ab]
        for config, truth in sizes.items():
            seen = [v[config] for v in verdicts if config in v]
            if seen:
                points.append({"regression": name, "config": config, "true_ratio": truth["ratio"],
                               "established": truth["ci"][0] > 1, "flagged": sum(seen), "runs": len(seen)})
    return sorted(points, key=lambda p: p["true_ratio"])


def curve(points: list[dict]) -> list[dict]:
    """The power points pooled into bins around SIZES of true slowdown."""
    bins = []
    for size, low, high in zip(SIZES, EDGES, EDGES[1:]):
        inside = [p for p in points if low <= p["true_ratio"] - 1 < high]
        runs = sum(p["runs"] for p in inside)
        bins.append({"size": size, "points": len(inside), "runs": runs, "flagged": sum(p["flagged"] for p in inside),
                     "rate": sum(p["flagged"] for p in inside) / runs if runs else None})
    return bins


def summary(preset: dict, thresholds: tuple[float, ...] = (0.01, 0.02, 0.03, 0.05)) -> dict:
    """False alarms and power at the preset's own threshold and at others (decided again from the rounds)."""
    out = {}
    for threshold in sorted({threshold_of(preset), *thresholds}):
        points = power(preset, threshold)
        reliable = [p for p in points if p["established"] and p["flagged"] >= math.ceil(0.9 * p["runs"] - 1e-9)]
        out[f"{threshold:g}"] = {"false_alarms": false_alarms(preset, threshold), "power": points,
                                 "curve": curve(points),
                                 "smallest_flagged_9_in_10": min((p["true_ratio"] for p in reliable), default=None)}
    return out


def markdown(name: str, preset: dict) -> list[str]:
    """The Markdown lines of one preset's false alarms and power, per threshold."""
    rates = summary(preset)
    own = threshold_of(preset)
    lines = [f"### The gate's false alarms and power (`{name}`)", "",
             "Decided again from each A/B's stored round ratios under the gate as it stands (99% t interval, "
             "Holm over the A/B's configs; experiments/regression/gate_rates.py). False alarms: same-against-same "
             "A/Bs exiting 1, with the exact one-sided 95% upper bound. Power: the share of A/Bs flagged, binned by "
             "true size (truth step).", "",
             "| threshold | false alarms | rate [95% upper] | " + " | ".join(f"+{s:.0%} true" for s in SIZES)
             + " | smallest flagged >= 9/10 |", "|---|---|---|" + "---|" * len(SIZES) + "---|"]
    for key, r in rates.items():
        fa = r["false_alarms"]
        cells = [f"{b['flagged']}/{b['runs']}" if b["runs"] else "-" for b in r["curve"]]
        small = f"+{r['smallest_flagged_9_in_10'] - 1:.1%}" if r["smallest_flagged_9_in_10"] else "none"
        mark = " (ab's)" if float(key) == own else ""
        lines.append(f"| {float(key):.0%}{mark} | {fa['flagged']}/{fa['runs']} | "
                     f"{(fa['rate'] or 0):.1%} [{(fa['upper_95'] or 1):.1%}] | " + " | ".join(cells) + f" | {small} |")
    lines.append("")
    return lines
