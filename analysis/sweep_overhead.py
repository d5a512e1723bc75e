# %% [markdown]
# # Where the main job's time goes
# For every measured config: measured iterations, warm-up, building the model and its DDP wrapper, and
# the rest (starting rank processes for the first config of each world size, sending work and results
# between processes, checking replicas). The rest is the runner's own overhead. Model build and warm-up
# are the slowest rank's, and measured time sums the slowest rank per iteration, so the rest is an
# estimate that can come out slightly below zero for a config.

# %%
import sys

import pandas as pd

from analysis.common import RUN_EXPERIMENTS, runs, save, script_main


def draw() -> None:
    """Tabulate timing per experiment from the run records."""
    rows = []
    for name in RUN_EXPERIMENTS:
        frame = runs(name)
        if frame.empty or "timing" not in frame:
            continue
        timing = pd.DataFrame(list(frame["timing"]))
        other = timing["config_wall_s"] - timing["setup_s"] - timing["warmup_s"] - timing["measured_s"]
        rows.append({"experiment": name, "configs": len(frame), "wall_s": timing["config_wall_s"].sum(),
                     "measured_s": timing["measured_s"].sum(), "warmup_s": timing["warmup_s"].sum(),
                     "setup_s": timing["setup_s"].sum(), "other_s": other.sum(),
                     "other_median_per_config_s": other.median(), "other_max_per_config_s": other.max(),
                     "other_pct_of_measured": 100 * other.sum() / timing["measured_s"].sum()})
    save(None, pd.DataFrame(rows), "sweep_overhead", note="" if rows else "no records; skipped")


def main(argv: list[str] | None = None) -> int:
    """`python analysis/sweep_overhead.py [--records PATH] [--out FOLDER]`: draw(), or 2 without records."""
    return script_main(argv, draw, make="`./run_all.sh`", needs=tuple(RUN_EXPERIMENTS))


# %%
if __name__ == "__main__":
    sys.exit(main())
