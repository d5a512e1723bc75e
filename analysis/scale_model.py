# %% [markdown]
# # The scale model: 1-16 ranks with emulated compute on emulated hosts, time dilated
# Every rank runs real DDP (ddp_core) and real Gloo all-reduces over emulated links; its model is a
# stand-in that waits for the profiled compute times (`--compute emulated`), and the whole system
# runs K times slower (`--time-dilation K`: links at rate / K, waits x K); every time shown here is
# undilated (divided by K). Parts:
# 1. validation at 2 ranks over one link: emulated against real compute (`scale_validation`), and
#    K = 1, 2, 4 against each other (`scale_dilation`);
# 2. fidelity: how busy this machine's cores were during each scale run (Gloo's and DDP's own CPU
#    work does not dilate: a run is faithful only while the cores keep up with it);
# 3. the paper's testbed as far as this machine reaches: 8 ranks per host, 100 Gbit/s between hosts,
#    compute of a V100 estimated from FLOPs (`scale_gpu_profile`); E4 at 1-16 ranks, E3 and E7 at 16;
# 4. the performance model against every emulated-compute run: network from the link's configured
#    rate and this machine's loopback all-reduce at the run's world size (`scale_loopback`) x K.

# %%
from __future__ import annotations

import sys

import pandas as pd

from analysis.common import caption, figure, runs, runs_folder, save, script_main
from experiments.core.stats import ratio_of_medians
from experiments.perfmodel.comm import CLUSTERS
from experiments.perfmodel.validation import prediction_errors

GOAL = 0.05  # emulated within 5% of real compute; dilations within 5% of K = 1
# Faithful while the cores were busy for at most this share of the machine during measured iterations:
# the rest is headroom for bursts (all ranks all-reduce at once).
BUSY_LIMIT = 0.5
SCALE_RUNS = ["scale_e4_one_host", "scale_e4_bert", "scale_e4_two_hosts", "scale_e3", "scale_e7", "scale_e3_one_host",
              "scale_e7_one_host", "scale_fidelity"]


def _ratio_row(numerator: pd.Series, denominator: pd.Series) -> dict:
    ratio = ratio_of_medians(list(numerator["latency_s"]), list(denominator["latency_s"]))
    return {"ratio": ratio["ratio"], "ci_low": ratio["ci"][0], "ci_high": ratio["ci"][1],
            "within_goal": abs(ratio["ratio"] - 1) <= GOAL}


def validation_table() -> pd.DataFrame:
    """Per model and overlap: real and emulated compute's median latency at 2 ranks, and their ratio."""
    frame = runs("scale_validation")
    rows = []
    if frame.empty:
        return pd.DataFrame()
    for (model, impl, link), group in frame.groupby(["model", "impl", "link"]):
        real, emulated = group[group["compute"] == "real"], group[group["compute"] == "emulated"]
        if real.empty or emulated.empty:
            continue
        real, emulated = real.iloc[-1], emulated.iloc[-1]
        rows.append({"model": model, "overlap": impl == "ddp_core", "link": link,
                     "real_ms": 1e3 * real["summary_p50"], "emulated_ms": 1e3 * emulated["summary_p50"],
                     **_ratio_row(emulated, real)})
    return pd.DataFrame(rows)


def dilation_table() -> pd.DataFrame:
    """Per model and K: undilated median latency against K = 1, and how busy the cores were."""
    frame = runs("scale_dilation")
    if frame.empty:
        return frame
    rows = []
    for model, group in frame.groupby("model"):
        base = group[group["time_dilation"] == 1.0]
        for _, row in group.sort_values("time_dilation").iterrows():
            rows.append({"model": model, "time_dilation": row["time_dilation"], "p50_ms": 1e3 * row["summary_p50"],
                         "cores_busy": row["timing"].get("cores_busy"),
                         **(_ratio_row(row, base.iloc[-1]) if not base.empty else {})})
    return pd.DataFrame(rows)


def scale_runs() -> pd.DataFrame:
    """Every scale-model run (E4, E3, E7), with its median, throughput and how busy the cores were."""
    frames = [runs(name).assign(experiment=name) for name in SCALE_RUNS]
    frames = [f for f in frames if not f.empty]
    if not frames:
        return pd.DataFrame()
    frame = pd.concat(frames, ignore_index=True)
    cores = frame["env_cpu_count"].fillna(1)
    busy = frame["timing"].apply(lambda t: t.get("cores_busy"))
    return frame.assign(p50_ms=1e3 * frame["summary_p50"], cores_busy=busy, busy_share=busy / cores,
                        faithful=busy / cores <= BUSY_LIMIT,
                        # older records kept the ranks' lifetime peak in timing, newer a peak per config
                        rank_memory_mb=frame["peak_memory_mb"].fillna(
                            frame["timing"].apply(lambda t: t.get("max_rss_mb"))))


def intra_host_table(dilation: float) -> pd.DataFrame:
    """Per world size: this machine's loopback bus bandwidth (the largest all-reduce of `scale_loopback`),
    what time dilation K makes of it, and the NVLink of the paper's testbed (the model's preset)."""
    frame = runs("scale_loopback", kind="allreduce")
    if frame.empty:
        return frame
    nvlink = CLUSTERS["paper-v100-nccl"].intra.busbw
    largest = frame[frame["elements"] == frame["elements"].max()]
    rows = [{"world_size": row.world_size, "loopback_busbw_GBps": row.summary_busbw_GBps, "time_dilation": dilation,
             "undilated_busbw_GBps": row.summary_busbw_GBps * dilation, "nvlink_busbw_GBps": nvlink / 1e9,
             "undilated_over_nvlink": row.summary_busbw_GBps * 1e9 * dilation / nvlink}
            for row in largest.sort_values("world_size").itertuples()]
    return pd.DataFrame(rows)


def model_errors() -> pd.DataFrame:
    """The model against every emulated-compute run (validate's rows), and whether the run was faithful."""
    rows = pd.DataFrame(prediction_errors(runs_folder()))
    if rows.empty:
        return rows
    rows = rows[rows["compute"] == "emulated"].reset_index(drop=True)
    return rows.assign(faithful=rows["busy_share"] <= BUSY_LIMIT)


def draw() -> None:
    """Tables for validation, dilation, fidelity and the model; a figure of E4, E3 and E7."""
    validation, dilation, frame = validation_table(), dilation_table(), scale_runs()
    save(None, validation, "scale_validation", note="" if not validation.empty else "no scale_validation records")
    save(None, dilation, "scale_dilation", note="" if not dilation.empty else "no scale_dilation records")
    errors = model_errors() if not frame.empty or not dilation.empty else pd.DataFrame()
    save(None, errors, "scale_model_errors", note="" if not errors.empty else "no emulated-compute runs")
    if frame.empty:
        save(None, frame, "scale_model", note="no scale-model records (scale_e4_*, scale_e3, scale_e7); skipped")
        return
    dilation = float(frame["time_dilation"].mode().iloc[0])  # the experiments' K
    intra = intra_host_table(dilation)
    save(None, intra, "scale_intra_host", note="" if not intra.empty else "no scale_loopback records")
    key = ["model", "world_size", "bucket_mb", "process_groups", "link", "time_dilation"]
    predicted = {tuple(r[k] for k in key): r["predicted_s"] for r in errors.to_dict("records")} if not errors.empty else {}
    frame["predicted_ms"] = [1e3 * predicted.get(tuple(r[k] for k in key), float("nan"))
                             for r in frame.to_dict("records")]
    table = frame[["experiment", "model", "world_size", "ranks_per_host", "link", "bucket_mb", "process_groups",
                   "time_dilation", "p50_ms", "predicted_ms", "summary_throughput", "cores_busy", "busy_share",
                   "faithful", "rank_memory_mb"]].sort_values(["experiment", "model", "world_size", "bucket_mb", "process_groups"])
    fig, axes = figure("SCALE MODEL: compute emulated from a V100 estimate, network emulated (8 ranks per host, "
                       f"100 Gbit/s between hosts), time dilation K = {', '.join(f'{k:g}' for k in sorted(frame['time_dilation'].unique()))}; "
                       f"times undilated. {caption(frame)}", ncols=3, width=4.4)
    e4 = frame[frame["experiment"].str.startswith("scale_e4")]
    for model, group in e4.groupby("model"):
        group = group.sort_values("world_size")
        one = group[group["world_size"] == 1]
        if one.empty:
            continue
        axes[0].plot(group["world_size"], one["p50_ms"].iloc[0] / group["p50_ms"], marker="o", label=f"{model} measured")
        axes[0].plot(group["world_size"], one["predicted_ms"].iloc[0] / group["predicted_ms"], ls="--", marker="x",
                     label=f"{model} model")
    axes[0].set(xscale="log", xlabel="ranks (8 per host)", ylabel="per-rank throughput / 1 rank",
                title="E4: scaling efficiency")
    axes[0].set_xscale("log", base=2)
    dilations = frame.groupby("model")["time_dilation"].agg(lambda k: k.mode().iloc[0])  # the experiments' K
    for ax, x, title in ((axes[1], "bucket_mb", "E3: bucket cap (MB)"), (axes[2], "process_groups", "E7: round-robin groups")):
        # each model at its largest world size: 16 ranks on 2 hosts (ResNet50), 4 on one (BERT-base)
        widest = frame[(frame["world_size"] == frame.groupby("model")["world_size"].transform("max"))
                       & (frame["time_dilation"] == frame["model"].map(dilations))]
        widest = widest[(widest["process_groups"] == 1) if x == "bucket_mb" else (widest["bucket_mb"] == 25)]
        for model, group in widest.groupby("model"):
            model = f"{model}, {group['world_size'].iloc[0]} ranks"
            group = group.sort_values(x).drop_duplicates(x, keep="last")
            ax.plot(group[x], group["p50_ms"], marker="o", label=f"{model} measured")
            ax.plot(group[x], group["predicted_ms"], ls="--", marker="x", label=f"{model} model")
        ax.set(xlabel=title, ylabel="ms per iteration (undilated)", title=title)
        if x == "bucket_mb":
            ax.set_xscale("log")
    for ax in axes:
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:  # a panel with no runs (a partial sweep) gets no empty legend
            ax.legend(fontsize=6)
    save(fig, table, "scale_model")


def main(argv: list[str] | None = None) -> int:
    """`python analysis/scale_model.py [--records PATH] [--out FOLDER]`: draw(), or 2 without records."""
    return script_main(argv, draw, make="`./run_all.sh`", needs=("scale_*",))


# %%
if __name__ == "__main__":
    sys.exit(main())
