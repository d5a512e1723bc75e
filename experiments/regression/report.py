"""The drill's summary: detections judged against true sizes, per preset and config, as JSON and Markdown."""
from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from experiments.regression import gate_rates

GOAL_SIZE = 1.05  # regressions at least this much slower in truth must be flagged ...
GOAL_RATE, GOAL_RUNS = 0.9, 10  # ... in at least 9 of 10 A/Bs


def detections(abs_: list[dict], kind: str) -> dict:
    """For one kind of A/B: runs, how many exited 1, and per config how many flagged it slower, the
    median ratio and the longest A/B."""
    runs = [r for r in abs_ if r["kind"] == kind and "rows" in r]
    configs = sorted({row["config"] for r in runs for row in r["rows"]})
    return {"runs": len(runs), "flagged": sum(r["exit"] == 1 for r in runs),
            "failed": sum(1 for r in abs_ if r["kind"] == kind and "rows" not in r),
            "max_seconds": max((r["seconds"] for r in runs), default=None),
            "per_config": {c: {"flagged": sum(row["verdict"] == "slower" for r in runs for row in r["rows"]
                                              if row["config"] == c),
                               "median_ratio": statistics.median(row["ratio"] for r in runs for row in r["rows"]
                                                                 if row["config"] == c)} for c in configs}}


def pooled_spread(truth: dict, config: str, quiet_only: bool, quiet: float = 0.2) -> dict:
    """The pooled standard deviation of log per-round ratios about each pair's own mean, over every
    pair of the truth run (all rounds, or those in which other processes kept at most `quiet` cores
    busy): how far one round's ratio strays, whatever the pair's true size."""
    squares, n, pairs = 0.0, 0, 0
    for sizes in truth.values():
        t = sizes.get(config)
        if t is None:
            continue
        logs = [math.log(r) for r, load in zip(t.get("round_ratios") or [], t.get("round_other_load") or [])
                if not quiet_only or (load is not None and load <= quiet)]
        if len(logs) < 2:
            continue
        mean = sum(logs) / len(logs)
        squares += sum((x - mean) ** 2 for x in logs)
        n, pairs = n + len(logs), pairs + 1
    return {"sd": math.sqrt(squares / (n - pairs)) if n > pairs else None, "rounds": n, "pairs": pairs}


def goal_status(must_flag: list[dict]) -> str:
    """`met`, `not met` (some regression missed more often than 9 of 10 allows), `not measured` (fewer
    than 10 A/Bs of some regression) or `no regression >= 5% in truth`."""
    if not must_flag:
        return "no regression >= 5% in truth"
    def allowed_misses(runs: int) -> int:  # 1 of 10 (in whole A/Bs: no float rounding at the boundary)
        return runs - math.ceil(GOAL_RATE * runs - 1e-9)

    if any(r["runs"] - r["flagged"] > allowed_misses(max(r["runs"], GOAL_RUNS)) for r in must_flag):
        return "not met"
    if all(r["runs"] >= GOAL_RUNS and r["runs"] - r["flagged"] <= allowed_misses(r["runs"]) for r in must_flag):
        return "met"
    return "not measured"


def judge(preset: dict) -> dict:
    """Goals for one preset: false alarms, detection of regressions >= 5% in truth, the smallest true size
    flagged in at least 90% of its A/Bs (per config), with the number of A/Bs behind each."""
    same = detections(preset["abs"], "same")
    goals: dict = {"false_alarms": {"flagged": same["flagged"], "runs": same["runs"]}, "per_config": {}}
    for name, sizes in preset["truth"].items():
        if name == "same":
            continue
        found = detections(preset["abs"], name)
        for config, truth in sizes.items():
            entry = goals["per_config"].setdefault(config, {"must_flag": [], "reliably_flagged": []})
            hits = found["per_config"].get(config, {}).get("flagged", 0)
            row = {"regression": name, "true_ratio": truth["ratio"], "established": truth["ci"][0] > 1,
                   "flagged": hits, "runs": found["runs"]}
            if truth["ratio"] >= GOAL_SIZE:
                entry["must_flag"].append(row)
            if found["runs"] and hits >= GOAL_RATE * found["runs"]:
                entry["reliably_flagged"].append(row)
    for entry in goals["per_config"].values():
        entry["goal"] = goal_status(entry["must_flag"])
        flagged = sorted(entry.pop("reliably_flagged"), key=lambda r: r["true_ratio"])
        entry["smallest_reliably_flagged"] = flagged[0] if flagged else None
    return goals


def markdown(state: dict) -> str:
    """The summary as Markdown tables, one section per preset."""
    thresholds = sorted({f"{r['threshold']:.0%}" for p in state["presets"].values() for r in p["abs"]
                         if r.get("threshold")})
    lines = [f"# Regression drill at {state['base'][:10]}", "",
             "True size: the geometric mean over the truth run's rounds (fresh sets of processes, every commit "
             "interleaved iteration by iteration) of each round's paired ratio regressed/base, with a 95% "
             "interval over rounds. A/Bs: `ddpbench ab` of the base against the regressed commit; flagged = "
             f"verdict `slower` for that config (99% interval; threshold {', '.join(thresholds) or 'ab default'}).",
             ""]
    for name, preset in state["presets"].items():
        lines += [f"## Preset `{name}`", "", "| regression | what | config | true size [95%] | flagged / A/Bs | "
                  "median A/B ratio | longest A/B |", "|---|---|---|---|---|---|---|"]
        for reg, sizes in preset["truth"].items():
            found = detections(preset["abs"], reg)
            what = "same commit (null)" if reg == "same" else state["injections"].get(reg, "")
            for config, t in sizes.items():
                c = found["per_config"].get(config)
                flagged = f"{c['flagged']} / {found['runs']}" if c else "-"
                median = f"{c['median_ratio']:.3f}" if c else "-"
                longest = f"{found['max_seconds']:.0f} s" if found["max_seconds"] else "-"
                lines.append(f"| {reg} | {what} | {config} | {t['ratio']:.3f} [{t['ci'][0]:.3f}, {t['ci'][1]:.3f}] "
                             f"({t['rounds']} rounds) | {flagged} | {median} | {longest} |")
        for config in sorted({c for sizes in preset["truth"].values() for c in sizes}):
            every, quiet = (pooled_spread(preset["truth"], config, q) for q in (False, True))
            if every["sd"] and quiet["sd"]:
                lines.append(f"- {config}: one round's log ratio strays by {every['sd']:.3f} (pooled sd over "
                             f"{every['pairs']} pairs, {every['rounds']} rounds); over the rounds in which other "
                             f"processes kept at most 0.2 cores busy, by {quiet['sd']:.3f} ({quiet['rounds']} rounds)")
        same = detections(preset["abs"], "same")
        lines += ["", f"Same against same: {same['flagged']} false alarms in {same['runs']} A/Bs.", ""]
        if preset.get("noise"):
            lines += ["Noise: spread (sd of log per-round ratios) of same-against-same, per instrument variant:", "",
                      "| variant | config | ratio [95%] | sd of log round ratios | rounds |", "|---|---|---|---|---|"]
            for variant, sizes in preset["noise"].items():
                for config, t in sizes.items():
                    lines.append(f"| {variant} | {config} | {t['ratio']:.3f} [{t['ci'][0]:.3f}, {t['ci'][1]:.3f}] | "
                                 f"{t['spread']:.3f} | {t['rounds']} |")
            lines.append("")
        for config, goal in judge(preset)["per_config"].items():
            small = goal["smallest_reliably_flagged"]
            small = (f"{small['regression']} (true {small['true_ratio']:.3f}, flagged {small['flagged']}/{small['runs']})"
                     if small else "none")
            met = goal["goal"]
            lines.append(f"- {config}: goal (every regression >= 5% in truth flagged in >= 9 of 10 A/Bs): {met}; "
                         f"smallest true size flagged in >= 90% of its A/Bs: {small}")
        lines.append("")
        lines += gate_rates.markdown(name, preset)
    return "\n".join(lines)


def write(state: dict, out: Path) -> None:
    """Write the state with its judged goals as JSON to `out`, and the Markdown beside it."""
    for preset in state["presets"].values():
        preset["goals"] = judge(preset)
        preset["gate_rates"] = gate_rates.summary(preset)
        configs = sorted({c for sizes in preset["truth"].values() for c in sizes})
        preset["round_spread"] = {c: {"all": pooled_spread(preset["truth"], c, False),
                                      "quiet": pooled_spread(preset["truth"], c, True)} for c in configs}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(state, indent=1) + "\n")
    out.with_suffix(".md").write_text(markdown(state))
