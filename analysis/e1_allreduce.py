# %% [markdown]
# # E1: all-reduce cost against granularity
# A fixed number of float32 parameters (60 M in the paper) all-reduced in calls of different sizes:
# the paper finds total time falls steeply as parameters per call grow (bucketing pays). A second panel
# shows the size sweep's bus bandwidth, `algbw * 2(n-1)/n`.

# %%
import sys

from analysis.common import caption, figure, line_with_band, measured, save, script_main


def draw() -> None:
    """Plot E1 and the size sweep from results/runs/<machine>/e1_allreduce.jsonl."""
    frame = measured("e1_allreduce", kind="allreduce")
    if frame is None:
        return
    fig, (left, right) = figure(caption(frame), ncols=2)
    table = []
    for (backend, world_size), group in frame.groupby(["backend", "world_size"]):
        label = f"{backend}, {world_size} ranks"
        gran = group[group["mode"] == "granularity"]
        if not gran.empty:
            line_with_band(left, gran, "elements", label)
        sizes = group[group["mode"] == "size"].assign(bytes=lambda g: g["elements"] * 4)
        if not sizes.empty:
            sizes = sizes.assign(busbw=sizes["summary_busbw_GBps"])
            right.plot(sizes["bytes"], sizes["busbw"], marker="o", label=label)
        table.append(group.assign(bytes_total=group["total_elements"] * 4))
    left.set(xscale="log", yscale="log", xlabel="float32 parameters per all-reduce call",
             ylabel="time to all-reduce all parameters (s)", title="E1: total time vs granularity")
    right.set(xscale="log", xlabel="message size (bytes)", ylabel="bus bandwidth (GB/s)",
              title="all-reduce size sweep")
    for ax in (left, right):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    import pandas as pd

    columns = ["mode", "backend", "device", "world_size", "elements", "bytes_total", "median", "q25", "q75", "wrong"]
    save(fig, pd.concat(table)[columns], "e1_allreduce")


def main(argv: list[str] | None = None) -> int:
    """`python analysis/e1_allreduce.py [--records PATH] [--out FOLDER]`: draw(), or 2 without records."""
    return script_main(argv, draw, make="`./run_all.sh`", needs=("e1_allreduce",))


# %%
if __name__ == "__main__":
    sys.exit(main())
