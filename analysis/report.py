# %% [markdown]
# # The report: every figure, its table, and the paper's findings against what was measured here
# Runs every experiment script, then writes results/report.md. Each verdict comes from raw samples:
# a ratio of medians with a bootstrap 95% confidence interval; "holds" needs the whole interval on the
# paper's side, "does not hold" the whole interval on the other side, anything else "not significant".

# %%
from __future__ import annotations

import importlib
import math
import sys
from dataclasses import fields

import pandas as pd

from analysis.common import (
    RUN_EXPERIMENTS,
    caption,
    cycle_means,
    job_profiles,
    machines_in,
    output_dir,
    runs,
    runs_folder,
    script_main,
    spread,
    where,
)
from experiments.core.config import RunConfig
from experiments.core.stats import holm, ratio_of_medians

SCRIPTS = ["e1_allreduce", "e2_overlap", "e3_bucket_size", "e4_scaling", "e5_skip_sync", "e6_convergence",
           "e7_round_robin", "e8_backends", "model_validation", "model_extrapolation", "link_emulation", "scale_model", "sweep_overhead"]
# Tables a script writes besides its own, shown under its section.
EXTRA_TABLES = {"link_emulation": {
    "link_fidelity_summary": "Fidelity per link: share of the rate reached by messages of 4 MiB and more, and the "
                             "median time of 1-16 KiB all-reduces over the link and on loopback",
    "link_overlap": "E2 on every network: saving, communication share of the no-overlap iteration, best saving "
                    "possible (min(compute, communication)), best behind backward alone, and the model's predicted saving",
    "link_bucket_recommendation": "tune-bucket for each link against the best cap measured over it",
    "link_e1_allreduce": "E1 over a link beside loopback: seconds to all-reduce the same total in calls of each size",
}, "scale_model": {
    "scale_validation": "Validation at 2 ranks over one link: emulated against real compute (same model, same "
                        "profile machine); ratio of medians with a 95% CI, goal within 5%",
    "scale_dilation": "Time dilation at 2 ranks: undilated latency at K = 1, 2, 4 against K = 1 (goal within 5%)",
    "scale_intra_host": "Inside an emulated host: this machine's loopback all-reduce (25 MiB) x K against the "
                        "NVLink of the paper's testbed (the model's preset)",
    "scale_model_errors": "The performance model against every emulated-compute run (network: the links' configured "
                          "rates and this machine's loopback at the run's world size, x K)",
}}
# E6: "no visible harm" read as a final loss within 25% of reducing every iteration (upper CI bound).
NO_VISIBLE_HARM = 1.25
TITLES = {
    "e1_allreduce": "E1 - all-reduce time against parameters per call",
    "e2_overlap": "E2 - latency breakdown with and without overlap",
    "e3_bucket_size": "E3 - latency against bucket size",
    "e4_scaling": "E4 - scalability",
    "e5_skip_sync": "E5 - skipping synchronisation: speed",
    "e6_convergence": "E6 - skipping synchronisation: convergence",
    "e7_round_robin": "E7 - round-robin process groups",
    "e8_backends": "E8 - NCCL against Gloo",
    "model_validation": "Performance model: predicted against measured latency on this machine",
    "model_extrapolation": "Performance model: E3/E4/E5/E7 predicted for the paper's testbed (predictions, not "
                           "measurements; assumptions in analysis/model_extrapolation.py)",
    "link_emulation": "The emulated cluster: link fidelity (left), overlap saving by communication share (right), "
                      "and the performance model against every emulated run (table; network = the configured rate)",
    "scale_model": "Scale model: 1-16 ranks with compute emulated from a V100 estimate, network emulated (8 ranks "
                   "per host, 100 Gbit/s between hosts), time dilated K times; all times undilated",
    "sweep_overhead": "Where the job's time goes (seconds; 'other' is the runner's overhead, including "
                      "process start-up for the first config of each world size)",
}


def verdict(ratio: dict, paper_side_below_one: bool = True) -> str:
    """'holds' if the ratio's CI lies wholly on the paper's side of 1, 'does not hold' if wholly on the other."""
    low, high = ratio["ci"]
    if paper_side_below_one:
        return "holds" if high < 1 else "does not hold" if low > 1 else "not significant"
    return "holds" if low > 1 else "does not hold" if high < 1 else "not significant"


def compare_samples(numerator: list[float], denominator: list[float]) -> dict | None:
    """ratio_of_medians, or None when either side has fewer than two samples (no interval possible)."""
    if len(numerator) < 2 or len(denominator) < 2:
        return None
    return ratio_of_medians(numerator, denominator)


def fmt_ratio(ratio: dict) -> str:
    """A ratio with its confidence interval, as text."""
    return f"{ratio['ratio']:.3f} [{ratio['ci'][0]:.3f}, {ratio['ci'][1]:.3f}]"


def markdown_table(frame: pd.DataFrame, digits: int = 4) -> str:
    """A pandas frame as a GitHub markdown table."""
    def cell(value) -> str:
        if isinstance(value, float):
            return "" if math.isnan(value) else f"{value:.{digits}g}"
        return str(value)

    header = "| " + " | ".join(map(str, frame.columns)) + " |"
    rule = "|" + "---|" * len(frame.columns)
    rows = ["| " + " | ".join(cell(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join([header, rule, *rows])


def network(link: str) -> str:
    """Where a run's ranks talked: loopback, or emulated hosts behind links of a rate."""
    return "loopback" if link == "none" else f"{link} links"


def findings() -> list[dict]:
    """The paper's headline findings, each measured on loopback and on every emulated link, side by side."""
    rows = findings_of("") + findings_of("link_")
    # Many findings are tested at once: a verdict against 1 holds only where it stays significant after
    # Holm's correction over all of them (family-wise 5%); E3 and E6 have rules of their own.
    tested = [row for row in rows if row.get("p") is not None]
    for row, adjusted in zip(tested, holm([row["p"] for row in tested])):
        if adjusted >= 0.05 and row["verdict"] in ("holds", "does not hold"):
            row["verdict"] = f"not significant after Holm ({row['verdict']} alone)"
    for row in rows:
        row.pop("p", None)
    order: dict[str, int] = {}
    for i, row in enumerate(rows):
        order.setdefault(row["finding"], i)  # each finding where it first appears, then its networks
    return sorted(rows, key=lambda row: order[row["finding"]])


def findings_of(prefix: str) -> list[dict]:
    """The findings from the records of experiments named `prefix` + e2_overlap, ...; one row per network."""
    out = []
    e2 = runs(f"{prefix}e2_overlap")
    for (model, backend, ws, link), group in (e2.groupby(["model", "backend", "world_size", "link"]) if not e2.empty else []):
        impls = {impl: g.iloc[0] for impl, g in group.groupby("impl")}
        if {"ddp_core", "ddp_core_no_overlap"} <= set(impls):
            r = ratio_of_medians(impls["ddp_core"]["latency_s"], impls["ddp_core_no_overlap"]["latency_s"])
            paper = {("resnet50", "nccl"): "38.0%", ("bert-base", "nccl"): "35.2%",
                     ("resnet50", "gloo"): "26.8%", ("bert-base", "gloo"): "21.5%"}.get((model, backend), "-")
            share = impls["ddp_core_no_overlap"]["exposed_comm_s"] / impls["ddp_core_no_overlap"]["summary_p50"]
            out.append({"finding": f"E2 overlap cuts latency ({model}, {backend}, {ws} ranks)", "network": network(link),
                        "paper": paper,
                        "here": f"{100 * (1 - r['ratio']):.1f}% (overlap/no-overlap {fmt_ratio(r)}); "
                                f"communication is {100 * share:.0f}% of the no-overlap iteration",
                        "verdict": verdict(r), "p": r["p"]})
    e3 = runs(f"{prefix}e3_bucket_size")
    for (model, backend, ws, link), group in (e3.groupby(["model", "backend", "world_size", "link"]) if not e3.empty else []):
        group = group.assign(p50=group["summary_p50"]).sort_values("bucket_mb")
        if len(group) < 3:
            continue
        best = group.loc[group["p50"].idxmin()]
        worst = group.loc[group["p50"].idxmax()]
        inside = group["bucket_mb"].iloc[0] < best["bucket_mb"] < group["bucket_mb"].iloc[-1]
        edges = [group.iloc[0], group.iloc[-1]]
        vs_edges = [ratio_of_medians(best["latency_s"], e["latency_s"]) for e in edges]
        holds = inside and all(r["ci"][1] < 1 for r in vs_edges)
        out.append({"finding": f"E3 best bucket lies between the extremes ({model}, {backend}, {ws} ranks)",
                    "network": network(link),
                    "paper": "yes; a good cap can more than double speed",
                    "here": f"best {best['bucket_mb']:g} MB of {group['bucket_mb'].min():g}-{group['bucket_mb'].max():g}; "
                            f"worst/best {worst['p50'] / best['p50']:.2f}x; best/edges "
                            + ", ".join(fmt_ratio(r) for r in vs_edges),
                    "verdict": "holds" if holds else ("does not hold" if not inside else "not significant")})
    e4 = runs(f"{prefix}e4_scaling")
    for (model, backend, link), group in (e4.groupby(["model", "backend", "link"]) if not e4.empty else []):
        if prefix:  # on links: one host of 2 ranks against 2 hosts of 1 rank
            by_hosts = {row.ranks_per_host: row for row in group.itertuples()}
            if {1, 2} <= set(by_hosts):
                r = ratio_of_medians(by_hosts[1].latency_s, by_hosts[2].latency_s)
                out.append({"finding": f"E4 scaling ({model}, {backend})", "network": network(link),
                            "paper": "near-linear with NCCL; Gloo far worse",
                            "here": f"2 ranks on 2 hosts / on 1 host: {fmt_ratio(r)}",
                            "verdict": "measured (no paper threshold)"})
            continue
        group = group.sort_values("world_size")
        if len(group) < 2:
            continue
        first, last = group.iloc[0], group.iloc[-1]
        efficiency = last["summary_throughput"] / first["summary_throughput"] * first["world_size"] / last["world_size"]
        out.append({"finding": f"E4 scaling ({model}, {backend})", "network": network(link),
                    "paper": "near-linear with NCCL; Gloo far worse",
                    "here": f"{100 * efficiency:.0f}% scaling efficiency from {first['world_size']} to "
                            f"{last['world_size']} ranks", "verdict": "measured (no paper threshold)"})
    e5 = runs(f"{prefix}e5_skip_sync")
    for (model, backend, ws, link), group in (e5.groupby(["model", "backend", "world_size", "link"]) if not e5.empty else []):
        base = group[group["sync_every"] == 1]
        for n in sorted(set(group["sync_every"]) - {1}):
            if base.empty:
                break
            r = compare_samples(cycle_means(group[group["sync_every"] == n].iloc[0]["latency_s"], n),
                                base.iloc[0]["latency_s"])
            if r is None:
                continue
            paper = {2: "15%", 4: "25%", 8: "38%"}.get(n, "-")
            out.append({"finding": f"E5 reduce every {n} lowers latency ({model}, {backend}, {ws} ranks)",
                        "network": network(link),
                        "paper": f"{paper} (256 GPUs, approx.)", "here": f"{100 * (1 - r['ratio']):.1f}% (mean per cycle of {n} / every iteration "
                                f"{fmt_ratio(r)})", "verdict": verdict(r), "p": r["p"]})
    e6 = runs(f"{prefix}e6_convergence", kind="train")
    if not e6.empty and (e6["sync_every"] == 1).any():
        base = e6[e6["sync_every"] == 1].iloc[0]
        tail = max(1, len(base["loss"]) // 10)
        for row in e6[e6["sync_every"] > 1].itertuples():
            r = ratio_of_medians(row.loss[-tail:], base["loss"][-tail:])
            out.append({"finding": f"E6 reduce every {row.sync_every}: final loss against every iteration",
                        "network": network(row.link),
                        "paper": "no visible harm at small batch", "here": f"final-loss ratio {fmt_ratio(r)}",
                        "verdict": "holds" if r["ci"][1] < NO_VISIBLE_HARM
                        else "does not hold" if r["ci"][0] > NO_VISIBLE_HARM else "not significant"})
    e7 = runs(f"{prefix}e7_round_robin")
    for (model, backend, ws, link), group in (e7.groupby(["model", "backend", "world_size", "link"]) if not e7.empty else []):
        base = group[group["process_groups"] == 1]
        most = group[group["process_groups"] == group["process_groups"].max()]
        if base.empty or most.iloc[0]["process_groups"] == 1:
            continue
        r = ratio_of_medians(most.iloc[0]["latency_s"], base.iloc[0]["latency_s"])
        out.append({"finding": f"E7 {most.iloc[0]['process_groups']} round-robin groups beat 1 ({model}, {backend}, {ws} ranks)",
                    "network": network(link),
                    "paper": "yes, more so on Gloo", "here": f"{100 * (1 - r['ratio']):.1f}% ({fmt_ratio(r)})",
                    "verdict": verdict(r), "p": r["p"]})
    return out


# Config fields that may differ between repeats of one config: latency per iteration does not depend on them.
NOT_THE_CONFIG = ("iters", "warmup")


def disagreeing_repeats(frames: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Configs measured by several experiments of one job whose interquartile ranges do not overlap: the
    experiments disagree by more than each one's spread (drift of the machine, or something else)."""
    keys = [f.name for f in fields(RunConfig) if f.name not in NOT_THE_CONFIG]
    tagged = [frame.assign(experiment=name) for name, frame in frames.items() if not frame.empty]
    if not tagged:
        return pd.DataFrame()
    every = pd.concat(tagged, ignore_index=True)
    rows = []
    for values, group in every.groupby([k for k in keys if k in every], dropna=False):
        if group["experiment"].nunique() < 2:
            continue
        stats = [spread(cycle_means(s, n)) for s, n in zip(group["latency_s"], group["sync_every"])]
        if max(q25 for _, q25, _ in stats) <= min(q75 for _, _, q75 in stats):
            continue  # every pair of interquartile ranges overlaps
        c = group.iloc[0]
        extras = [f"{k} {c[k]}" for k, default in (("sync_every", 1), ("process_groups", 1), ("comm_hook", "none"),
                                                   ("link", "none"), ("ranks_per_host", 1)) if c[k] != default]
        medians = [median for median, _, _ in stats]
        rows.append({"config": ", ".join([c["model"], f"{c['world_size']} ranks", f"{c['bucket_mb']:g} MB", c["impl"],
                                          *extras]),
                     "repeats (median ms [IQR])": "; ".join(
                         f"{e} {m * 1e3:.1f} [{q25 * 1e3:.1f}-{q75 * 1e3:.1f}]"
                         for e, (m, q25, q75) in zip(group["experiment"], stats)),
                     "slowest/fastest": max(medians) / min(medians)})
    return pd.DataFrame(rows)


def model_error_lines(data: pd.DataFrame) -> list[str]:
    """The model's median and worst |error| over a table of predictions, and over world sizes 4-16
    where it has them (the scale model's goal); nothing for a table without errors."""
    if "error" not in data or data.empty:
        return []
    lines = []
    wide = data[data["world_size"] >= 4] if "world_size" in data else data.iloc[:0]
    faithful = wide[wide["faithful"].astype(bool)] if "faithful" in wide else wide.iloc[:0]
    for label, part in (("these", data), ("world sizes 4-16 of these", wide),
                        ("the faithful runs (cores at most half busy) at world sizes 4-16 of these", faithful)):
        if not part.empty:
            errors = part["error"].abs()
            lines.append(f"Model error over {label} {len(part)} runs: median |error| {errors.median():.1%}, "
                         f"worst {errors.max():.1%}.")
    return [*lines, ""]


def skipped_because(note_file) -> str:
    """What the report says for a section without a table: why, where the script said so."""
    note = note_file.read_text().strip() if note_file.exists() else ""
    if not note or note == "no records; skipped":
        return "Not measured on this machine."
    return f"Skipped: {note.replace('; skipped', '')}."


def draw() -> None:
    """Run every experiment script on the records (results/runs/<machine>/ or --records), then write
    report.md beside their figures and tables (results/ or --out)."""
    for name in SCRIPTS:
        importlib.import_module(f"analysis.{name}").draw()  # a missing experiment is noted, not an error
    root = output_dir()
    whose = runs_folder() if not runs_folder().is_file() else runs_folder().parent  # named after its machine
    profiles = sorted(set(job_profiles().values()))
    command = "./run_all.sh" + (f" --profile {profiles[0]}" if len(profiles) == 1 else "")
    lines = [f"# ddpbench report: {whose.name}", "",
             f"The machine `{whose.name}`: generated by `./ddpbench report` from the records under "
             f"`{where(runs_folder())}/`; re-run `{command}` to measure again.", ""]
    smoke = "smoke" in profiles
    if smoke:
        lines += ["**Smoke profile: tiny models, inputs and iteration counts. This report checks the plumbing "
                  "(measuring, recording, analysis, report) end to end; its numbers are not findings about this "
                  "machine or the paper. For findings run `./run_all.sh` (the quick profile on CPUs, full on "
                  "GPUs).**", ""]
    frames = [f for f in (runs(n) for n in RUN_EXPERIMENTS) if not f.empty]
    if frames:
        lines += [f"Hardware: {caption(pd.concat(frames, ignore_index=True))}.", ""]
        sources = machines_in(pd.concat(frames, ignore_index=True))
        if len(sources) > 1:
            lines += [f"**Warning: these records come from {len(sources)} machines ({'; '.join(sources)}); numbers "
                      "measured on different machines are not comparable. Keep one machine's records per folder.**",
                      ""]
    lines += ["## The paper against this machine" + (" (smoke: a check of the plumbing, not findings)" if smoke else ""),
              "", "Ratios are medians of per-iteration latency (this config over its baseline) with a bootstrap 95% "
              "confidence interval from the raw samples (iterations of one launch each: the noise between launches "
              "is not in it). The E2, E5 and E7 verdicts hold only where they stay significant after Holm's "
              "correction over all of them (family-wise 5%); E3 needs the best cap's intervals against both "
              "extremes below 1, E6 its interval below the no-harm bound.", ""]
    table = pd.DataFrame(findings())
    lines += [markdown_table(table) if not table.empty else f"No records yet: run `{command}`.", ""]
    repeats = disagreeing_repeats({p + n: runs(p + n) for p in ("", "link_") for n in RUN_EXPERIMENTS})
    lines += ["## Repeats that disagree", "",
              "Configs that several experiments of this job measured (iterations and warm-up aside), listed where "
              "the repeats' interquartile ranges do not overlap: a difference between experiments smaller than "
              "this is within this machine's drift, not an effect.", "",
              markdown_table(repeats, digits=3) if not repeats.empty
              else "None: every repeated config agrees within its interquartile range.", ""]
    for name in SCRIPTS:
        lines += [f"## {TITLES[name]}", ""]
        figure, csv = root / "figures" / f"{name}.png", root / "tables" / f"{name}.csv"
        if figure.exists():
            lines += [f"![{name}](figures/{name}.png)", ""]
        try:
            data = pd.read_csv(csv)
        except (FileNotFoundError, pd.errors.EmptyDataError):
            data = pd.DataFrame()
        lines += [markdown_table(data) if not data.empty else skipped_because(root / "tables" / f"{name}.note"), ""]
        lines += model_error_lines(data)
        for extra, title in EXTRA_TABLES.get(name, {}).items():
            try:
                extra_data = pd.read_csv(root / "tables" / f"{extra}.csv")
            except (FileNotFoundError, pd.errors.EmptyDataError):
                continue
            lines += [f"### {title}", "", markdown_table(extra_data), "", *model_error_lines(extra_data)]
    (root / "report.md").write_text("\n".join(lines))
    print(f"wrote {root / 'report.md'}")


def main(argv: list[str] | None = None) -> int:
    """`python analysis/report.py [--records PATH] [--out FOLDER]`: draw(), or 2 without records."""
    return script_main(argv, draw, make="`./run_all.sh`")


# %%
if __name__ == "__main__":
    sys.exit(main())
