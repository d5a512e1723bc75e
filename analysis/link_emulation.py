# %% [markdown]
# # The emulated cluster: how faithful its links are, and what overlap saves over them
# Ranks on network namespaces joined by tc-shaped links (`ddpbench run --link RATE`). Three parts:
# 1. fidelity: the all-reduce's bus bandwidth against the configured rate, per message size
#    (`link_fidelity`), and the latency of small messages over a link and on loopback
#    (`model_allreduce` at the same sizes);
# 2. overlap: E2's saving against the share of the no-overlap iteration spent communicating, measured
#    and predicted, beside the best saving possible, min(compute, communication) / no-overlap iteration
#    (and the tighter bound for DDP, which hides communication behind backward only);
# 3. the performance model against every emulated run, with the network taken from the link's
#    configured rate (never fitted to these runs), and tune-bucket's cap against E3's best over links.

# %%
from __future__ import annotations

import sys

import numpy as np
import pandas as pd

from analysis.common import caption, figure, runs, runs_folder, save, script_main
from experiments.core.config import parse_rate
from experiments.core.profile import find_profile
from experiments.core.records import read_records
from experiments.perfmodel.comm import emulated, fit
from experiments.perfmodel.predict import predict_rows, recommend
from experiments.perfmodel.simulate import Schedule
from experiments.perfmodel.validation import measured_latency, prediction_errors

FAITHFUL = 0.9  # a link is emulated faithfully when the largest messages reach this share of its rate
SMALL_BYTES = 16 * 1024  # messages this small take a latency, not a bandwidth


def fidelity_table() -> pd.DataFrame:
    """Per link and message size: median time, bus bandwidth, its share of the rate, and loopback's time."""
    frame = runs("link_fidelity", kind="allreduce")
    if frame.empty:
        return frame
    loopback = runs("model_allreduce", kind="allreduce")
    loopback_p50 = ({} if loopback.empty else
                    {row.elements * 4: row.summary_p50 for row in loopback.itertuples() if row.world_size == 2})
    rows = []
    for row in frame.itertuples():
        rate_bytes = parse_rate(row.link) / 8
        nbytes = row.elements * 4
        rows.append({"link": row.link, "rate_GBps": rate_bytes / 1e9, "bytes": nbytes, "p50_s": row.summary_p50,
                     "busbw_GBps": row.summary_busbw_GBps, "share_of_rate": row.summary_busbw_GBps * 1e9 / rate_bytes,
                     "loopback_p50_s": loopback_p50.get(nbytes, np.nan)})
    return pd.DataFrame(rows).sort_values(["rate_GBps", "bytes"]).reset_index(drop=True)


def fidelity_summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per link: the share of its rate that messages of 4 MiB and more reach, and how long small messages take over it and on loopback."""
    rows = []
    for link, group in table.groupby("link", sort=False):
        # Messages of 4 MiB and more (or the largest measured, where none is that large).
        large = group[group["bytes"] >= min(4 << 20, group["bytes"].max())]
        small = group[group["bytes"] <= SMALL_BYTES]
        rows.append({"link": link, "rate_GBps": group["rate_GBps"].iloc[0],
                     "large_share_min": large["share_of_rate"].min(), "large_share_max": large["share_of_rate"].max(),
                     "faithful": bool(large["share_of_rate"].min() >= FAITHFUL) if not large.empty else False,
                     "small_p50_ms": 1e3 * float(small["p50_s"].median()),
                     "small_loopback_p50_ms": 1e3 * float(small["loopback_p50_s"].median())})
    return pd.DataFrame(rows)


def e1_table() -> pd.DataFrame:
    """E1 over a link beside loopback: seconds to all-reduce the same total in calls of each size."""
    link = runs("link_e1_allreduce", kind="allreduce")
    if link.empty:
        return link
    loopback = runs("e1_allreduce", kind="allreduce")
    loopback = {} if loopback.empty else {(r.elements, r.total_elements): r.summary_p50 for r in loopback.itertuples()
                                          if r.mode == "granularity" and r.world_size == 2}
    return pd.DataFrame([{"link": r.link, "total_elements": r.total_elements, "elements_per_call": r.elements,
                          "calls": r.summary_calls, "p50_s": r.summary_p50,
                          "loopback_p50_s": loopback.get((r.elements, r.total_elements), np.nan)}
                         for r in link.itertuples()])


def overlap_table(folder_records: list[dict], machine_comm) -> pd.DataFrame:
    """E2 on every network: saving, communication share, the best saving possible, and the model's saving."""
    rows = []
    for experiment in ("e2_overlap", "link_e2_overlap"):
        frame = runs(experiment)
        for (model, link, ws), group in (frame.groupby(["model", "link", "world_size"]) if not frame.empty else []):
            by_impl = {impl: g.iloc[0] for impl, g in group.groupby("impl")}
            if {"ddp_core", "ddp_core_no_overlap"} - set(by_impl):
                continue
            on, off = by_impl["ddp_core"], by_impl["ddp_core_no_overlap"]
            no_overlap = off["summary_p50"]
            comm = off["exposed_comm_s"]
            predicted = {}
            profile = find_profile(folder_records, off)
            if profile is not None:
                comm_model = machine_comm if link == "none" else emulated(machine_comm, link, parse_rate(link), 1)
                rows_predicted = predict_rows(profile, comm_model, [Schedule(world_size=ws, overlap=o) for o in (True, False)])
                predicted = {"predicted_saving_pct": 100 * (1 - rows_predicted[0]["latency_ms"] / rows_predicted[1]["latency_ms"])}
            rows.append({"model": model, "link": link, "world_size": ws, "overlap_s": on["summary_p50"],
                         "no_overlap_s": no_overlap, "saving_pct": 100 * (1 - on["summary_p50"] / no_overlap),
                         "comm_share_pct": 100 * comm / no_overlap,
                         "best_possible_pct": 100 * min(comm, no_overlap - comm) / no_overlap,
                         # DDP overlaps communication with backward only: forward and optimizer cannot hide it.
                         "best_behind_backward_pct": 100 * min(comm, off["backward_s"]) / no_overlap, **predicted})
    return pd.DataFrame(rows)


def bucket_table(folder_records: list[dict], machine_comm) -> pd.DataFrame:
    """Per model and link: tune-bucket's cap for that link against the caps link_e3 measured."""
    frame = runs("link_e3_bucket_size")
    rows = []
    for (model, link, ws), group in (frame.groupby(["model", "link", "world_size"]) if not frame.empty else []):
        profile = find_profile(folder_records, group.iloc[0])
        if profile is None:
            continue
        caps = sorted(group["bucket_mb"])
        comm_model = emulated(machine_comm, link, parse_rate(link), 1)
        recommended = recommend(predict_rows(profile, comm_model, [Schedule(world_size=ws, bucket_mb=c) for c in caps]))
        latency = {row.bucket_mb: measured_latency({"config": {"sync_every": row.sync_every}, "latency_s": row.latency_s})
                   for row in group.itertuples()}
        best = min(latency, key=latency.get)
        rows.append({"model": model, "link": link, "recommended_mb": recommended["bucket_mb"], "best_measured_mb": best,
                     "measured_at_recommended_s": latency[recommended["bucket_mb"]], "measured_at_best_s": latency[best],
                     "recommended_over_best": latency[recommended["bucket_mb"]] / latency[best]})
    return pd.DataFrame(rows)


def draw() -> None:
    """Tables and the figure of the emulated cluster, from whatever link records exist."""
    folder = runs_folder()
    records = read_records(folder) if folder.exists() else []
    if not any(r.get("config", {}).get("link", "none") != "none" for r in records):
        save(None, pd.DataFrame(), "link_emulation",
             note="no records over emulated links (`ddpbench network --check` says whether this machine can); skipped")
        return
    table = fidelity_table()
    summary = fidelity_summary(table) if not table.empty else pd.DataFrame()
    try:
        machine_comm = fit(records, "gloo", "cpu").model
    except ValueError:
        machine_comm = None
    has_profiles = machine_comm is not None and any(r.get("kind") == "profile" for r in records)
    overlap = overlap_table(records, machine_comm) if machine_comm is not None else pd.DataFrame()
    validation = pd.DataFrame(prediction_errors(folder)) if has_profiles else pd.DataFrame()
    if not validation.empty:
        validation = validation[(validation["link"] != "none") & (validation["compute"] == "real")]  # (else: scale_model)

    fig, (ax_fid, ax_overlap) = figure(caption(runs("link_e2_overlap")), ncols=2, width=5.5)
    for link, group in table.groupby("link", sort=False) if not table.empty else []:
        # Points are the measured sizes; the dotted line only guides the eye (sizes between were not measured).
        ax_fid.plot(group["bytes"], group["share_of_rate"], marker="o", ls=":", lw=0.8, label=link)
    ax_fid.axhline(FAITHFUL, color="grey", ls="--", lw=1, label=f"{FAITHFUL:.0%} of the rate")
    # Messages within the token bucket (128 KiB or 1 ms of the rate) pass faster than the rate: cut at 1.5.
    ax_fid.set(xscale="log", ylim=(0, 1.5), xlabel="bytes per all-reduce (2 hosts; points measured)",
               ylabel="bus bandwidth / configured rate", title="fidelity: what each emulated link delivers")
    ax_fid.legend(fontsize=7)
    if not overlap.empty:
        share = np.linspace(0, 100, 101)
        ax_overlap.plot(share, np.minimum(share, 100 - share), "k--", lw=1,
                        label="best possible: min(compute, comm) / no-overlap")
        for link_kind, marker in (("loopback", "s"), ("link", "o")):
            part = overlap[(overlap["link"] == "none") == (link_kind == "loopback")]
            for model, group in part.groupby("model"):
                ax_overlap.scatter(group["comm_share_pct"], group["saving_pct"], marker=marker,
                                   label=f"{model}, {link_kind} (measured)")
                for row in group.itertuples():
                    ax_overlap.annotate(row.link if row.link != "none" else "loopback", (row.comm_share_pct, row.saving_pct),
                                        fontsize=6, xytext=(3, 3), textcoords="offset points")
                if "predicted_saving_pct" in group:
                    ax_overlap.scatter(group["comm_share_pct"], group["predicted_saving_pct"], marker=marker,
                                       facecolors="none", edgecolors="grey")
                    # Each prediction tied to the run it predicts: a thin line from measured to predicted.
                    ax_overlap.vlines(group["comm_share_pct"], group["saving_pct"], group["predicted_saving_pct"],
                                      colors="grey", lw=0.6)
        ax_overlap.scatter([], [], marker="o", facecolors="none", edgecolors="grey",
                           label="model's prediction (line: to its run)")
        ax_overlap.axhline(0, color="k", lw=0.5)
    ax_overlap.set(xlabel="communication share of the no-overlap iteration (%)", ylabel="overlap saving (%)",
                   title="E2: what overlap saves, by communication share")
    ax_overlap.legend(fontsize=6, loc="upper left")
    save(None, summary, "link_fidelity_summary")
    save(None, table, "link_fidelity")
    save(None, overlap, "link_overlap")
    save(None, e1_table(), "link_e1_allreduce")
    if has_profiles:
        save(None, bucket_table(records, machine_comm), "link_bucket_recommendation")
    errors = validation["error"].abs() if not validation.empty else pd.Series(dtype=float)
    if not validation.empty:
        print(f"link_emulation: model over {len(validation)} emulated runs, median |error| {errors.median():.1%}, "
              f"worst {errors.max():.1%}")
    save(fig, validation.sort_values("error", key=abs, ascending=False) if not validation.empty else validation,
         "link_emulation")


def main(argv: list[str] | None = None) -> int:
    """`python analysis/link_emulation.py [--records PATH] [--out FOLDER]`: draw(), or 2 without records."""
    return script_main(argv, draw, make="`./run_all.sh`", needs=("link_*",))


# %%
if __name__ == "__main__":
    sys.exit(main())
