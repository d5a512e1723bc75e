# %% [markdown]
# # Model predictions for the paper's testbed (not measurements)
# The paper measured up to 256 V100 GPUs; this script predicts E3, E4, E5 and E7 there with the
# performance model, to set beside the paper's headline findings. Everything below is a model
# prediction resting on stated assumptions:
# - network: the presets `paper-v100-nccl` and `paper-v100-gloo` (experiments/perfmodel/comm.py says
#   where each number comes from; the Gloo preset is an assumption, not a measurement);
# - computation: this machine's one-process profile (which gradient is ready when, relative to the
#   rest), scaled so that a synchronised iteration computes for the time a V100 would need at the
#   paper's input sizes, estimated from FLOPs (table below): a rough estimate, not a measurement;
# - GPUs: communication overlaps computation (its own streams), as on the paper's testbed.
# With a GPU profile (`ddpbench profile` on the GPU), `ddpbench predict` needs no compute estimate.

# %%
from __future__ import annotations

import sys

import pandas as pd

from analysis.common import figure, runs_folder, save, script_main
from experiments.core.profile import Profile
from experiments.core.records import read_records
from experiments.perfmodel.comm import CLUSTERS
from experiments.perfmodel.gpus import PAPER_INPUTS, estimated_seconds
from experiments.perfmodel.simulate import Schedule, simulate

WORLD_SIZES = [1, 2, 4, 8, 16, 32, 64, 128, 256]
CAPS = [0, 1, 2, 5, 10, 25, 50, 100, 200]
BACKENDS = {"NCCL": "paper-v100-nccl", "Gloo": "paper-v100-gloo"}


def v100_profiles() -> dict[str, Profile]:
    """This machine's profiles of the paper's models, scaled to the estimated V100 compute time."""
    folder = runs_folder()
    records = [r for r in read_records(folder) if r.get("kind") == "profile" and r["status"] == "ok"] \
        if folder.exists() else []
    profiles = {}
    for record in records:  # the newest one-process profile of each model wins (one GPU per rank on the cluster)
        if record["config"]["model"] in PAPER_INPUTS and record["config"]["world_size"] == 1:
            profile = Profile.from_record(record)
            seconds = estimated_seconds(profile.model, "v100")
            profiles[profile.model] = profile.scaled(seconds / profile.compute)
    return profiles


def predictions(profiles: dict[str, Profile]) -> pd.DataFrame:
    """Every predicted point of the four experiments."""
    rows = []

    def add(experiment, model, backend, schedule):
        prediction = simulate(profiles[model], CLUSTERS[BACKENDS[backend]], schedule)
        rows.append({"experiment": experiment, "model": model, "backend": backend, "world_size": schedule.world_size,
                     "bucket_mb": schedule.bucket_mb, "sync_every": schedule.sync_every,
                     "process_groups": schedule.process_groups, "predicted_s": prediction.latency,
                     "exposed_comm_s": prediction.breakdown["exposed_comm"]})

    for model in profiles:
        for backend in BACKENDS:
            for ws in WORLD_SIZES:
                add("E4", model, backend, Schedule(world_size=ws))
            for cap in CAPS:
                add("E3", model, backend, Schedule(world_size=32, bucket_mb=cap))
            for n in (1, 2, 4, 8):
                add("E5", model, backend, Schedule(world_size=256, sync_every=n))
            for k in (1, 3, 5):
                add("E7", model, backend, Schedule(world_size=32, process_groups=k))
    return pd.DataFrame(rows)


def draw() -> None:
    """Predict, plot the four experiments, save the table."""
    profiles = v100_profiles()
    if not profiles:
        folder = runs_folder()
        found = sorted({r["config"]["model"] for r in (read_records(folder) if folder.exists() else [])
                        if r.get("kind") == "profile"})
        # Say why: the reader of the report otherwise takes the empty section for a failure.
        save(None, pd.DataFrame(), "model_extrapolation",
             note="no profiles of resnet50/bert-base; skipped: the prediction scales this machine's profiles of the "
                  f"paper's models, and the records here profile {', '.join(found) or 'no model'} "
                  "(the quick and full profiles of ./run_all.sh profile resnet50 and bert-base)")
        return
    table = predictions(profiles)
    fig, axes = figure("MODEL PREDICTIONS, not measurements: paper-v100 presets (NCCL from datasheets, Gloo "
                       "assumed), compute estimated from FLOPs at 40% of V100 FP32 peak; see the script's header",
                       ncols=4, width=4.2)
    panels = [("E4", "world_size", "GPUs", "E4: throughput scaling efficiency"),
              ("E3", "bucket_mb", "bucket cap MB (32 GPUs)", "E3: latency against bucket cap"),
              ("E5", "sync_every", "reduce every n (256 GPUs)", "E5: mean latency per iteration"),
              ("E7", "process_groups", "round-robin groups (32 GPUs)", "E7: latency against groups")]
    for ax, (experiment, x, xlabel, title) in zip(axes, panels):
        for (model, backend), group in table[table["experiment"] == experiment].groupby(["model", "backend"]):
            group = group.sort_values(x)
            y = group["predicted_s"]
            if experiment == "E4":
                y = y.iloc[0] / y  # throughput per GPU relative to one GPU
            ax.plot(group[x], y, marker="o", label=f"{model}, {backend}")
        ax.set(xlabel=xlabel, title=title, ylabel="efficiency" if experiment == "E4" else "predicted seconds")
        if experiment in ("E4", "E3"):
            ax.set_xscale("symlog" if experiment == "E3" else "log", base=2 if experiment == "E4" else 10)
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=6)
    save(fig, table, "model_extrapolation")


def main(argv: list[str] | None = None) -> int:
    """`python analysis/model_extrapolation.py [--records PATH] [--out FOLDER]`: draw(), or 2 without records."""
    return script_main(argv, draw, make="`./run_all.sh`")


# %%
if __name__ == "__main__":
    sys.exit(main())
