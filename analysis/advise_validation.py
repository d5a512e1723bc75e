# %% [markdown]
# # `ddpbench advise` against measured runs of models the suite never built
# For each model, `ddpbench advise` profiled it (as 2 co-located copies) and predicted the iteration at
# world size 2 on this machine from that profile and the all-reduce fit of `results/runs/<machine>`;
# `ddpbench run` then measured the same config. Records: `results/advise/` (the advise profiles and the
# runs); the commands are in the README ("Your own model"). Run: `python -m analysis.advise_validation`.

# %%
from __future__ import annotations

import pandas as pd

from analysis.common import machine, results_dir, save
from experiments.core.records import read_records
from experiments.perfmodel.validation import measured_latency, prediction_errors


def main() -> None:
    """Predicted against measured latency per run, with the runs' spread; a table and a printout."""
    folder = results_dir() / "advise"
    rows = pd.DataFrame(prediction_errors(folder, allreduce=results_dir() / "runs" / machine()))
    runs = [r for r in read_records(folder) if r.get("kind") == "run" and r["status"] == "ok"]
    spread = pd.DataFrame([{"model": r["config"]["model"], "impl": r["config"]["impl"], "measured_s": measured_latency(r),
                            "measured_p25_s": pd.Series(r["latency_s"]).quantile(0.25),
                            "measured_p75_s": pd.Series(r["latency_s"]).quantile(0.75)} for r in runs])
    table = rows[["model", "model_config", "impl", "batch_size", "image_size", "seq_len", "measured_s",
                  "predicted_s", "error"]].merge(spread, on=["model", "impl", "measured_s"])
    save(None, table, "advise_validation")
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(table.to_string(index=False))
    print(f"median |error| {table['error'].abs().median():.1%}, worst {table['error'].abs().max():.1%}")


if __name__ == "__main__":
    main()
