"""The interference term's validation tables (Markdown on stdout), from measure.sh's records:

    python benchmarks/interference_validation/table.py [OUT] > OUT/table.md

OUT is the folder measure.sh wrote, by default the reference machine's,
results/reference/x86_64-2cpu/interference (its table.md is this script's output).

1. the stored runs (the main job's loopback and link runs: no run repeated) re-predicted with today's probes;
2. the fresh subset: profiles, probes and E2 at 2.5 Gbit/s in one session;
3. advise for ViT-B/16: today's advise against today's runs, and the stored advise profile against the
   stored runs with today's probe.
Every prediction is shown without the interference term, with the term of its own model's probe, and with
the term of another model's probe (the newest probe of any other model in the same file): the term is
meant as the machine's, so a model predicted with another's term tests whether it carries over.
"""
from __future__ import annotations

import dataclasses
import json
import sys
import tempfile
from pathlib import Path

from experiments.core.profile import Profile
from experiments.core.records import read_records
from experiments.perfmodel.interference import from_record, pick
from experiments.perfmodel.predict import comm_model
from experiments.perfmodel.simulate import Schedule, simulate
from experiments.perfmodel.validation import describe_errors, measured_latency, prediction_errors

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "results" / "reference" / "x86_64-2cpu"
STORED_FIT = REFERENCE / "runs" / "x86_64-2cpu"  # the stored runs' all-reduce records


def shown(path: Path) -> Path:
    """`path` as the table names it: relative to the repository where inside it (the table is committed)."""
    path = path.resolve()
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


def session_fit(out: Path) -> Path:
    """The all-reduce records measure.sh made in the session (the fit sections 2 and 3 predict with), else the
    stored ones."""
    return out / "allreduce.jsonl" if (out / "allreduce.jsonl").exists() else STORED_FIT


def pairs(runs: Path, probes: Path | None, allreduce: Path | None = None, keep=lambda row: True):
    """(row without the term, row with it) per run, matched by position (the same runs, the same order)."""
    plain = [r for r in prediction_errors(runs, allreduce=allreduce, interference=False) if keep(r)]
    slowed = [r for r in prediction_errors(runs, allreduce=allreduce, interference=probes or True) if keep(r)]
    return list(zip(plain, slowed))


def others_term(runs: Path, probes: list[dict], allreduce: Path | None = None) -> list[dict]:
    """Each run predicted with the newest probe of another model than its own (None where there is none)."""
    rows = []
    for plain in prediction_errors(runs, allreduce=allreduce, interference=False):
        others = [r for r in probes if r["config"]["model"] != plain["model"]]
        if not others:
            rows.append(None)
            continue
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "others.jsonl"
            path.write_text("".join(json.dumps(r) + "\n" for r in others))
            mine = [r for r in prediction_errors(runs, allreduce=allreduce, interference=path)
                    if r["model"] == plain["model"] and r["impl"] == plain["impl"]]
        rows.append(mine[0])
    return rows


def probes_in(path: Path) -> list[dict]:
    """The probe records in `path`."""
    return [r for r in read_records(path) if r.get("kind") == "interference" and r["status"] == "ok"]


def probe_lines(path: Path) -> list[str]:
    """One line per probe record: its term and the load it ran under."""
    lines = []
    for r in read_records(path):
        if r.get("kind") == "interference" and r["status"] == "ok":
            t = r["timing"]
            lines.append(f"- {from_record(r).describe()}; load average {t.get('load_average', float('nan')):.1f}; "
                         f"per-round interquartile {r['summary']['spread_s_per_byte'][0] * 1e9:+.2f} to "
                         f"{r['summary']['spread_s_per_byte'][1] * 1e9:+.2f} ms per MB")
    return lines


def stored(out: Path) -> list[str]:
    lines = ["## 1. The stored runs, re-predicted with today's probes (no run repeated)", ""]
    lines += probe_lines(out / "probes.jsonl") + [""]
    real = pairs(STORED_FIT, out / "probes.jsonl", keep=lambda r: r["compute"] == "real")
    for name, keep in (("loopback, 1-2 ranks (38 runs)", lambda r: r["link"] == "none"),
                       ("emulated links, real compute (54 runs)", lambda r: r["link"] != "none"),
                       ("of them at 2.5 Gbit/s", lambda r: r["link"] == "2.5gbit")):
        chosen = [(a, b) for a, b in real if keep(a)]
        lines.append(f"- {name}: without the term {describe_errors([a['error'] for a, _ in chosen])}; "
                     f"with it {describe_errors([b['error'] for _, b in chosen])}")
    return lines + [""]


def fresh(out: Path) -> list[str]:
    folder = out / "link"
    if not (folder / "runs.jsonl").exists():
        return ["## 2. Fresh subset: not measured", ""]
    lines = ["## 2. Fresh subset in one session: E2 at 2.5 Gbit/s, 2 emulated hosts", ""]
    lines += probe_lines(folder / "profile.jsonl") + [""]
    lines += ["| model | overlap | measured ms | cores busy (of 2, all processes) | predicted ms, no term | error | "
              "with its term | error | with another model's term | error |", "|---|---|---|---|---|---|---|---|---|---|"]
    runs = {(r["config"]["model"], r["config"]["impl"]): r for r in read_records(folder / "runs.jsonl")
            if r.get("kind") == "run"}
    both = pairs(folder, None, allreduce=session_fit(out))
    other = others_term(folder, probes_in(folder / "profile.jsonl"), allreduce=session_fit(out))
    for (a, b), c in zip(both, other):
        busy = (runs[(a["model"], a["impl"])].get("timing") or {}).get("cores_busy")
        lines.append(f"| {a['model']} | {'on' if a['impl'] == 'ddp_core' else 'off'} | {a['measured_s'] * 1e3:.1f} | "
                     f"{busy:.2f} | {a['predicted_s'] * 1e3:.1f} | {a['error']:+.1%} | {b['predicted_s'] * 1e3:.1f} | "
                     f"{b['error']:+.1%} | {c['predicted_s'] * 1e3:.1f} | {c['error']:+.1%} |")
    lines += ["", f"Without the term: {describe_errors([a['error'] for a, _ in both])}; with its own model's: "
              f"{describe_errors([b['error'] for _, b in both])}; with another model's: {describe_errors([c['error'] for c in other])}.",
              ""]
    return lines


def vit_rows(profile_record: dict, runs: list[dict], probes: list[dict], others: list[dict], fit: Path) -> list[str]:
    """Predicted (without the term, with its own probe's, with another model's) against measured, overlap on and
    off, for one ViT profile, on the network of the all-reduce records `fit`."""
    profile = Profile.from_record(profile_record)
    plain = comm_model(None, fit)
    slowed = dataclasses.replace(plain, interference=pick(probes, "gloo", "cpu", model=profile.model))
    other = dataclasses.replace(plain, interference=pick(others, "gloo", "cpu"))
    rows = []
    for run in runs:
        overlap = run["config"]["impl"] == "ddp_core"
        plan = Schedule(world_size=2, overlap=overlap)
        measured = measured_latency(run)
        a, b, c = (simulate(profile, comm, plan).latency for comm in (plain, slowed, other))
        busy = (run.get("timing") or {}).get("cores_busy")
        rows.append(f"| {'on' if overlap else 'off'} | {measured * 1e3:.1f} | "
                    f"{'-' if busy is None else f'{busy:.2f}'} | {a * 1e3:.1f} | {a / measured - 1:+.1%} | "
                    f"{b * 1e3:.1f} | {b / measured - 1:+.1%} | {c * 1e3:.1f} | {c / measured - 1:+.1%} |")
    return rows


def vit(out: Path) -> list[str]:
    folder = out / "vit"
    header = ["| overlap | measured ms | cores busy (of 2, all processes) | predicted ms, no term | error | with its term | "
              "error | with another model's term | error |", "|---|---|---|---|---|---|---|---|---|"]
    if not (folder / "runs.jsonl").exists():
        return ["## 3. ViT-B/16 advise: not measured", ""]
    records = read_records(folder / "vit_b_16.profile.jsonl")
    profile = next(r for r in records if r.get("kind") == "profile")
    runs = [r for r in read_records(folder / "runs.jsonl") if r.get("kind") == "run"]
    lines = ["## 3. ViT-B/16, 32 px, batch 4, 2 ranks on loopback", ""] + probe_lines(folder / "vit_b_16.profile.jsonl")
    others = probes_in(out / "probes.jsonl") if (out / "probes.jsonl").exists() else []
    lines += ["", "Another model's term: " + (pick(others, "gloo", "cpu").describe() if others else "none measured")]
    lines += ["", f"Today's advise profile against today's runs (the all-reduce of {shown(session_fit(out))}):", ""]
    lines += header + vit_rows(profile, runs, records, others, session_fit(out))
    lines += ["", "The same profile and runs with the stored all-reduce records (a loaded session's fit):", ""]
    lines += header + vit_rows(profile, runs, records, others, STORED_FIT)
    old_profile = next(r for r in read_records(REFERENCE / "advise" / "vit_b_16.profile.jsonl")
                       if r.get("kind") == "profile")
    old_runs = [r for r in read_records(REFERENCE / "advise" / "validation_runs.jsonl")
                if r.get("kind") == "run" and r["config"]["model"] == "torchvision:vit_b_16"]
    lines += ["", "The stored advise profile against the stored runs (docs' 29% case), with today's probe and the stored "
                  "all-reduce records:", ""]
    return lines + header + vit_rows(old_profile, old_runs, records, others, STORED_FIT) + [""]


def order(out: Path) -> list[str]:
    """ViT-B/16's runs in the order each sweep measured them: is the gap the configs' or the order's?"""
    lines = ["## 4. ViT-B/16: the same two configs in either order", ""]
    sweeps = [("overlap first (the vit part)", out / "vit" / "runs.jsonl"),
              ("no overlap first, 15 warm-up iterations", out / "vit" / "order_before_settling.jsonl"),
              ("overlap first, first job run once unrecorded", out / "vit" / "order_ddp_core_first.jsonl"),
              ("no overlap first, first job run once unrecorded", out / "vit" / "order_ddp_core_no_overlap_first.jsonl")]
    found = [(name, [r for r in read_records(path) if r.get("kind") == "run"]) for name, path in sweeps if path.exists()]
    if not found:
        return lines + ["(not measured)", ""]
    lines += ["| sweep | first config | its p50 ms | second config | its p50 ms |", "|---|---|---|---|---|"]
    for name, (first, second) in found:
        def label(r):
            return "overlap" if r["config"]["impl"] == "ddp_core" else "no overlap"
        lines.append(f"| {name} | {label(first)} | {first['summary']['p50'] * 1e3:.1f} | {label(second)} | "
                     f"{second['summary']['p50'] * 1e3:.1f} |")
    return lines + ["", "Each sweep's first config runs in freshly started ranks; the first two sweeps were measured before a "
                    "fresh pool ran its first job once unrecorded (experiments/measure/sweep.py).", ""]


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else REFERENCE / "interference"
    load = (out / "load.txt").read_text().strip().splitlines() if (out / "load.txt").exists() else []
    lines = ["# The interference term against measurements (issue 29)", "",
             "Made by `benchmarks/interference_validation/measure.sh` and `table.py` beside it. "
             "The load averages of this 2-core machine while it ran (above 2: other work competed for the cores):", ""]
    lines += [f"    {line}" for line in load] + [""]
    print("\n".join(lines + stored(out) + fresh(out) + vit(out) + order(out)))


if __name__ == "__main__":
    main()
