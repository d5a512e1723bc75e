# %% [markdown]
# # The performance model against this machine
# The all-reduce model is fitted to the all-reduce records only (E1 and the denser size sweep); the
# compute profile comes from `ddpbench profile`: one process alone for world size 1, and for world size
# 2 two independent one-process copies at once, as the two ranks of a run share this host's two cores
# (`--colocated`). Neither ever sees a training run. Every ddp_core training run measured here is then
# predicted and compared: median and worst absolute error. Finally the bucket cap the model recommends
# is checked against the caps E3 measured.

# %%
from __future__ import annotations

import sys

import numpy as np
import pandas as pd

from analysis.common import caption, figure, runs, runs_folder, save, script_main
from experiments.core.profile import find_profile
from experiments.core.records import read_records
from experiments.perfmodel.comm import fit
from experiments.perfmodel.predict import DEFAULT_CAPS, predict_rows, recommend
from experiments.perfmodel.simulate import Schedule
from experiments.perfmodel.validation import measured_latency, prediction_errors


def bucket_check(records: list[dict], comm) -> pd.DataFrame:
    """Per E3 model: the recommended cap, and measured latency at it, at 25 MB and at the best cap."""
    e3 = runs("e3_bucket_size")
    rows = []
    for (model, ws), group in (e3.groupby(["model", "world_size"]) if not e3.empty else []):
        profile = find_profile(records, group.iloc[0])
        if profile is None:
            continue
        caps = [float(c) for c in DEFAULT_CAPS.split(",")]
        recommended = recommend(predict_rows(profile, comm, [Schedule(world_size=ws, bucket_mb=c) for c in caps]))
        latency = {row.bucket_mb: measured_latency({"config": {"sync_every": row.sync_every}, "latency_s": row.latency_s})
                   for row in group.itertuples()}
        best = min(latency, key=latency.get)
        cap = recommended["bucket_mb"]
        rows.append({"model": model, "world_size": ws, "recommended_mb": cap,
                     "measured_at_recommended_s": latency.get(cap, np.nan), "measured_at_25mb_s": latency.get(25.0),
                     "best_measured_mb": best, "measured_at_best_s": latency[best],
                     "recommended_over_best": latency.get(cap, np.nan) / latency[best],
                     "recommended_over_25mb": latency.get(cap, np.nan) / latency.get(25.0, np.nan)})
    return pd.DataFrame(rows)


def draw() -> None:
    """Fit, predict every measured run, plot predicted against measured; tables for the report."""
    folder = runs_folder()
    records = read_records(folder) if folder.exists() else []
    if not any(r.get("kind") == "profile" for r in records):
        save(None, pd.DataFrame(), "model_validation", note="no profile records; run `ddpbench profile`; skipped")
        return
    comm_fit = fit(records, "gloo", "cpu")
    rows = pd.DataFrame(prediction_errors(folder))
    # runs over emulated links: link_emulation; with emulated compute: scale_model
    rows = rows[(rows["link"] == "none") & (rows["compute"] == "real")] if not rows.empty else rows
    fig, (ax_fit, ax_val) = figure(caption(runs("e2_overlap")), ncols=2, width=5.5)
    fitted = pd.DataFrame(comm_fit.rows)
    for mode, group in fitted.groupby("mode"):
        ax_fit.scatter(group["bytes_per_call"], group["measured_s"] / group["calls"], label=f"measured ({mode})", s=14)
    model = comm_fit.model.intra
    # The fitted model itself, one smooth curve per rank count (not a line joining the records' sizes).
    sizes = np.logspace(np.log10(fitted["bytes_per_call"].min()), np.log10(fitted["bytes_per_call"].max()), 200)
    for ranks in sorted(fitted["ranks"].unique()):
        ax_fit.plot(sizes, [comm_fit.model.allreduce(n, int(ranks)) for n in sizes], lw=1, color="k",
                    label=f"fit at {ranks} ranks: 2(p-1)alpha + 2(p-1)/p n/busbw")
    ax_fit.set(xscale="log", yscale="log", xlabel="bytes per all-reduce", ylabel="seconds per all-reduce",
               title=f"all-reduce fit: alpha {model.alpha * 1e6:.0f} us, busbw {model.busbw / 1e9:.2f} GB/s\n"
                     f"median |error| {comm_fit.median_error:.0%}, worst {comm_fit.worst_error:.0%}")
    ax_fit.legend(fontsize=7)
    for model_name, group in rows.groupby("model"):
        ax_val.scatter(group["measured_s"], group["predicted_s"], label=model_name, s=16)
    top = max(rows["measured_s"].max(), rows["predicted_s"].max()) * 1.1
    grid = np.array([0, top])
    ax_val.plot(grid, grid, "k-", lw=1)
    ax_val.fill_between(grid, grid * 0.9, grid * 1.1, color="grey", alpha=0.2, label="within 10%")
    errors = rows["error"].abs()
    ax_val.set(xlabel="measured seconds per iteration (median)", ylabel="predicted seconds per iteration",
               title=f"{len(rows)} runs: median |error| {errors.median():.1%}, worst {errors.max():.1%}")
    ax_val.legend(fontsize=7)
    save(None, fitted, "model_allreduce_fit")
    save(None, bucket_check(records, comm_fit.model), "model_bucket_recommendation")
    save(fig, rows.sort_values("error", key=abs, ascending=False), "model_validation")
    print(f"model_validation: {len(rows)} runs, median |error| {errors.median():.1%}, worst {errors.max():.1%}")


def main(argv: list[str] | None = None) -> int:
    """`python analysis/model_validation.py [--records PATH] [--out FOLDER]`: draw(), or 2 without records."""
    return script_main(argv, draw, make="`./run_all.sh`")


# %%
if __name__ == "__main__":
    sys.exit(main())
