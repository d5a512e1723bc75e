# %% [markdown]
# # The report: every figure, its table, and the paper's findings against what was measured here
# Runs every experiment script, then writes results/report.md. Each verdict comes from raw samples:
# a ratio of medians with a bootstrap 95% confidence interval; "holds" needs the whole interval on the
# paper's side, "does not hold" the whole interval on the other side, anything else "not significant".

# %%
from __future__ import annotations

import importlib
import math

import pandas as pd

from analysis.common import RUN_EXPERIMENTS, caption, cycle_means, machine, results_dir, runs
from experiments.stats import ratio_of_medians

SCRIPTS = ["e1_allreduce", "e2_overlap", "e3_bucket_size", "e4_scaling", "e5_skip_sync", "e6_convergence",
           "e7_round_robin", "e8_backends", "model_validation", "model_extrapolation", "sweep_overhead"]
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


def findings() -> list[dict]:
    """The paper's headline findings, each with the value measured here and a verdict."""
    out = []
    e2 = runs("e2_overlap")
    for (model, backend, ws), group in (e2.groupby(["model", "backend", "world_size"]) if not e2.empty else []):
        impls = {impl: g.iloc[0] for impl, g in group.groupby("impl")}
        if {"ddp_core", "ddp_core_no_overlap"} <= set(impls):
            r = ratio_of_medians(impls["ddp_core"]["latency_s"], impls["ddp_core_no_overlap"]["latency_s"])
            paper = {("resnet50", "nccl"): "38.0%", ("bert-base", "nccl"): "35.2%",
                     ("resnet50", "gloo"): "26.8%", ("bert-base", "gloo"): "21.5%"}.get((model, backend), "-")
            share = impls["ddp_core_no_overlap"]["exposed_comm_s"] / impls["ddp_core_no_overlap"]["summary_p50"]
            out.append({"finding": f"E2 overlap cuts latency ({model}, {backend}, {ws} ranks)", "paper": paper,
                        "here": f"{100 * (1 - r['ratio']):.1f}% (overlap/no-overlap {fmt_ratio(r)}); "
                                f"communication is {100 * share:.0f}% of the no-overlap iteration",
                        "verdict": verdict(r)})
    e3 = runs("e3_bucket_size")
    for (model, backend, ws), group in (e3.groupby(["model", "backend", "world_size"]) if not e3.empty else []):
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
                    "paper": "yes; a good cap can more than double speed",
                    "here": f"best {best['bucket_mb']:g} MB of {group['bucket_mb'].min():g}-{group['bucket_mb'].max():g}; "
                            f"worst/best {worst['p50'] / best['p50']:.2f}x; best/edges "
                            + ", ".join(fmt_ratio(r) for r in vs_edges),
                    "verdict": "holds" if holds else ("does not hold" if not inside else "not significant")})
    e4 = runs("e4_scaling")
    for (model, backend), group in (e4.groupby(["model", "backend"]) if not e4.empty else []):
        group = group.sort_values("world_size")
        if len(group) < 2:
            continue
        first, last = group.iloc[0], group.iloc[-1]
        efficiency = last["summary_throughput"] / first["summary_throughput"] * first["world_size"] / last["world_size"]
        out.append({"finding": f"E4 scaling ({model}, {backend})", "paper": "near-linear with NCCL; Gloo far worse",
                    "here": f"{100 * efficiency:.0f}% scaling efficiency from {first['world_size']} to "
                            f"{last['world_size']} ranks", "verdict": "measured (no paper threshold)"})
    e5 = runs("e5_skip_sync")
    for (model, backend, ws), group in (e5.groupby(["model", "backend", "world_size"]) if not e5.empty else []):
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
                        "paper": f"{paper} (256 GPUs, approx.)", "here": f"{100 * (1 - r['ratio']):.1f}% (mean per cycle of {n} / every iteration "
                                f"{fmt_ratio(r)})", "verdict": verdict(r)})
    e6 = runs("e6_convergence", kind="train")
    if not e6.empty and (e6["sync_every"] == 1).any():
        base = e6[e6["sync_every"] == 1].iloc[0]
        tail = max(1, len(base["loss"]) // 10)
        for row in e6[e6["sync_every"] > 1].itertuples():
            r = ratio_of_medians(row.loss[-tail:], base["loss"][-tail:])
            out.append({"finding": f"E6 reduce every {row.sync_every}: final loss against every iteration",
                        "paper": "no visible harm at small batch", "here": f"final-loss ratio {fmt_ratio(r)}",
                        "verdict": "holds" if r["ci"][1] < NO_VISIBLE_HARM
                        else "does not hold" if r["ci"][0] > NO_VISIBLE_HARM else "not significant"})
    e7 = runs("e7_round_robin")
    for (model, backend, ws), group in (e7.groupby(["model", "backend", "world_size"]) if not e7.empty else []):
        base = group[group["process_groups"] == 1]
        most = group[group["process_groups"] == group["process_groups"].max()]
        if base.empty or most.iloc[0]["process_groups"] == 1:
            continue
        r = ratio_of_medians(most.iloc[0]["latency_s"], base.iloc[0]["latency_s"])
        out.append({"finding": f"E7 {most.iloc[0]['process_groups']} round-robin groups beat 1 ({model}, {backend}, {ws} ranks)",
                    "paper": "yes, more so on Gloo", "here": f"{100 * (1 - r['ratio']):.1f}% ({fmt_ratio(r)})",
                    "verdict": verdict(r)})
    return out


def main() -> None:
    """Run every experiment script, then write results/report.md."""
    for name in SCRIPTS:
        importlib.import_module(f"analysis.{name}").main()
    root = results_dir()
    lines = [f"# ddpbench report: {machine()}", "",
             "Generated by `python -m analysis.report` from the records under "
             f"`results/runs/{machine()}/`; re-run `./run_all.sh` to measure again.", ""]
    frames = [f for f in (runs(n) for n in RUN_EXPERIMENTS) if not f.empty]
    if frames:
        lines += [f"Hardware: {caption(pd.concat(frames, ignore_index=True))}.", ""]
    lines += ["## The paper against this machine", "",
              "Ratios are medians of per-iteration latency (this config over its baseline) with a bootstrap 95% "
              "confidence interval from the raw samples.", ""]
    table = pd.DataFrame(findings())
    lines += [markdown_table(table) if not table.empty else "No records yet: run `./run_all.sh`.", ""]
    for name in SCRIPTS:
        lines += [f"## {TITLES[name]}", ""]
        figure, csv = root / "figures" / f"{name}.png", root / "tables" / f"{name}.csv"
        if figure.exists():
            lines += [f"![{name}](figures/{name}.png)", ""]
        try:
            data = pd.read_csv(csv)
        except (FileNotFoundError, pd.errors.EmptyDataError):
            data = pd.DataFrame()
        lines += [markdown_table(data) if not data.empty else "Not measured on this machine.", ""]
    (root / "report.md").write_text("\n".join(lines))
    print(f"wrote {root / 'report.md'}")


# %%
if __name__ == "__main__":
    main()
