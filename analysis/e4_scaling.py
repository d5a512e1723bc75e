# %% [markdown]
# # E4: scalability
# Latency and speedup against the number of ranks. Speedup is throughput over the one-rank throughput;
# the ideal line is linear. The paper: near-linear with NCCL, far worse with Gloo.

# %%
import sys

import pandas as pd

from analysis.common import caption, figure, line_with_band, measured, save, script_main


def draw() -> None:
    """Plot E4 from results/runs/<machine>/e4_scaling.jsonl."""
    frame = measured("e4_scaling")
    if frame is None:
        return
    fig, (left, right) = figure(caption(frame), ncols=2)
    tables = []
    for (model, backend), group in frame.groupby(["model", "backend"]):
        group = group.sort_values("world_size")
        line_with_band(left, group, "world_size", f"{model}, {backend}")
        base = group[group["world_size"] == group["world_size"].min()].iloc[0]
        # Throughput relative to the smallest world size, scaled to it (speedup 1 at one rank).
        speedup = group["summary_throughput"] / base["summary_throughput"] * base["world_size"]
        right.plot(group["world_size"], speedup, marker="o", label=f"{model}, {backend}")
        tables.append(group.assign(speedup=speedup, efficiency=speedup / group["world_size"]))
    top = int(frame["world_size"].max())
    right.plot([1, top], [1, top], "k--", label="ideal (linear)")
    left.set(xlabel="ranks (world size)", ylabel="seconds per iteration (median, IQR)", title="E4: latency")
    right.set(xlabel="ranks (world size)", ylabel="speedup in throughput", title="E4: scaling")
    for ax in (left, right):
        ax.set_xticks(sorted(frame["world_size"].unique()))  # ranks come whole: no 1.2-rank ticks
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    table = pd.concat(tables)[["model", "backend", "world_size", "median", "q25", "q75", "summary_throughput",
                               "speedup", "efficiency"]]
    save(fig, table, "e4_scaling")


def main(argv: list[str] | None = None) -> int:
    """`python analysis/e4_scaling.py [--records PATH] [--out FOLDER]`: draw(), or 2 without records."""
    return script_main(argv, draw, make="`./run_all.sh`", needs=("e4_scaling",))


# %%
if __name__ == "__main__":
    sys.exit(main())
