# %% [markdown]
# # E2: per-iteration latency breakdown, with and without overlap
# Stacked medians of forward, backward, exposed communication (waiting for all-reduce after backward)
# and optimizer, for ddp_core with overlap and for the same buckets reduced only after backward.
# The paper: overlap saves 38.0% (ResNet50) and 35.2% (BERT) on NCCL, 26.8% and 21.5% on Gloo.

# %%
import sys

import numpy as np
import pandas as pd

from analysis.common import PHASES, caption, figure, measured, save, script_main

PAPER_SAVING = {("resnet50", "nccl"): 38.0, ("bert-base", "nccl"): 35.2,
                ("resnet50", "gloo"): 26.8, ("bert-base", "gloo"): 21.5}


def overlap_table(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per model, backend and world size: latency with and without overlap, and the saving."""
    rows = []
    for (model, backend, world_size), group in frame.groupby(["model", "backend", "world_size"]):
        by_impl = {impl: g.iloc[0] for impl, g in group.groupby("impl")}
        if {"ddp_core", "ddp_core_no_overlap"} - set(by_impl):
            continue
        on, off = by_impl["ddp_core"]["median"], by_impl["ddp_core_no_overlap"]["median"]
        row = {"model": model, "backend": backend, "world_size": world_size, "overlap_s": on, "no_overlap_s": off,
               "saving_pct": 100 * (1 - on / off), "paper_saving_pct": PAPER_SAVING.get((model, backend), np.nan),
               "comm_share_no_overlap_pct": 100 * by_impl["ddp_core_no_overlap"]["exposed_comm_s"] / off}
        for impl, r in by_impl.items():
            for phase in PHASES:
                row[f"{impl}_{phase}_s"] = r.get(f"{phase}_s")
        rows.append(row)
    return pd.DataFrame(rows)


def draw() -> None:
    """Plot E2 from results/runs/<machine>/e2_overlap.jsonl."""
    frame = measured("e2_overlap")
    if frame is None:
        return
    table = overlap_table(frame)
    fig, (ax,) = figure(caption(frame), width=max(6.0, 1.6 * len(frame)))
    labels, bottoms = [], np.zeros(len(frame))
    for phase in PHASES:
        values = frame[f"{phase}_s"].fillna(0).to_numpy()
        ax.bar(range(len(frame)), values, bottom=bottoms, label=phase.replace("_", " "))
        bottoms += values
    labels = [f"{r.model}\n{r.backend}, {r.world_size} ranks\n{'overlap' if r.impl == 'ddp_core' else 'no overlap'}"
              for r in frame.itertuples()]
    ax.errorbar(range(len(frame)), frame["median"], yerr=[frame["median"] - frame["q25"], frame["q75"] - frame["median"]],
                fmt="k_", label="iteration median (IQR)")
    ax.set_xticks(range(len(frame)), labels, fontsize=7)
    ax.set(ylabel="seconds per iteration", title="E2: latency breakdown, with and without overlap")
    # Each phase is stacked at its own median; a sum of medians is not the median of the sums, so a
    # stack and its iteration median (+) differ by a little: the legend says so.
    ax.legend(fontsize=7, title="phases: each its own median", title_fontsize=7)
    save(fig, table, "e2_overlap")


def main(argv: list[str] | None = None) -> int:
    """`python analysis/e2_overlap.py [--records PATH] [--out FOLDER]`: draw(), or 2 without records."""
    return script_main(argv, draw, make="`./run_all.sh`", needs=("e2_overlap",))


# %%
if __name__ == "__main__":
    sys.exit(main())
