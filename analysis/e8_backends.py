# %% [markdown]
# # E8: NCCL against Gloo
# Every configuration measured with both backends, side by side. The paper: NCCL is considerably
# faster in most cases. On a machine without GPUs only Gloo runs, and this says so.

# %%
import sys

import pandas as pd

from analysis.common import RUN_EXPERIMENTS, caption, figure, runs, save, script_main, with_spread

KEY = ["model", "impl", "device", "world_size", "bucket_mb", "sync_every", "process_groups", "comm_hook",
       "batch_size", "image_size", "seq_len"]


def draw() -> None:
    """Pair every config measured on both backends (across all run experiments)."""
    frames = [runs(name) for name in RUN_EXPERIMENTS]
    frame = pd.concat([f for f in frames if not f.empty], ignore_index=True) if any(not f.empty for f in frames) \
        else pd.DataFrame()
    if frame.empty or frame["backend"].nunique() < 2:
        found = sorted(frame["backend"].unique()) if not frame.empty else []
        save(None, pd.DataFrame(), "e8_backends", note=f"needs both nccl and gloo records; found {found}")
        return
    frame = with_spread(frame).drop_duplicates(KEY + ["backend"])
    pairs = frame.pivot_table(index=KEY, columns="backend", values="median").dropna().reset_index()
    if pairs.empty or not {"nccl", "gloo"} <= set(pairs.columns):
        save(None, pd.DataFrame(), "e8_backends", note="no configuration was measured with both backends")
        return
    pairs["gloo_over_nccl"] = pairs["gloo"] / pairs["nccl"]
    fig, (ax,) = figure(caption(frame), width=max(6.0, 0.5 * len(pairs)))
    labels = [f"{r.model} ws{r.world_size} b{r.bucket_mb:g} n{r.sync_every} pg{r.process_groups}" for r in pairs.itertuples()]
    ax.bar([i - 0.2 for i in range(len(pairs))], pairs["nccl"], width=0.4, label="NCCL")
    ax.bar([i + 0.2 for i in range(len(pairs))], pairs["gloo"], width=0.4, label="Gloo")
    ax.set_xticks(range(len(pairs)), labels, rotation=90, fontsize=6)
    ax.set(ylabel="seconds per iteration (median)", yscale="log", title="E8: NCCL against Gloo")
    ax.legend()
    save(fig, pairs, "e8_backends")


def main(argv: list[str] | None = None) -> int:
    """`python analysis/e8_backends.py [--records PATH] [--out FOLDER]`: draw(), or 2 without records."""
    return script_main(argv, draw, make="`./run_all.sh`", needs=tuple(RUN_EXPERIMENTS))


# %%
if __name__ == "__main__":
    sys.exit(main())
