# %% [markdown]
# # `ddpbench advise` against measured runs of models the suite never built
# For each model, `ddpbench advise` profiled it (as 2 co-located copies) and predicted the iteration at
# world size 2 on this machine from that profile and the all-reduce fit of `results/runs/<machine>`;
# `ddpbench run` then measured the same config. Records: `results/advise/` (the advise profiles and the
# runs); the commands are in docs/performance-model.md ("How close advise came"). Run:
# `python analysis/advise_validation.py`, or for the reference machine's records
# `python analysis/advise_validation.py --records results/reference/x86_64-2cpu/advise --out /tmp/advise`.

# %%
from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from analysis.common import NoRecords, chosen_records, machine, save, script_main
from experiments.core.records import read_records
from experiments.perfmodel.validation import measured_latency, prediction_errors


MAKE = ("`./ddpbench advise --model M --out results/advise/M` and `./ddpbench run --model M --out "
        "results/advise/validation_runs.jsonl` (docs/performance-model.md, \"How close advise came\")")


def runs_beside(advise: Path) -> Path:
    """The runs folder beside an advise folder, whose all-reduce records the predictions are fitted to:
    <results>/runs/<this machine>, else its one machine folder (results/reference/<m>/runs/<m>)."""
    runs = advise.parent / "runs"
    folders = sorted(p for p in runs.iterdir() if p.is_dir()) if runs.is_dir() else []
    return runs / machine() if (runs / machine()).is_dir() or len(folders) != 1 else folders[0]


def draw() -> None:
    """Predicted against measured latency per run, with the runs' spread; a table and a printout."""
    folder = chosen_records()
    allreduce = runs_beside(folder)
    if not allreduce.is_dir():
        raise NoRecords(allreduce, "`./run_all.sh` (its all-reduce records are what advise's predictions are fitted to)")
    rows = pd.DataFrame(prediction_errors(folder, allreduce=allreduce))
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


def main(argv: list[str] | None = None) -> int:
    """`python analysis/advise_validation.py [--records PATH] [--out FOLDER]`: draw(), or 2 without records."""
    return script_main(argv, draw, make=MAKE, records="advise")


if __name__ == "__main__":
    sys.exit(main())
