# %% [markdown]
# # How much overlap ddp_core and PyTorch's DDP keep under torch.compile
# PyTorch's DDP under `torch.compile` splits the compiled graph at its bucket boundaries (dynamo's
# DDPOptimizer), so that buckets can still be reduced while the rest of backward runs. ddp_core is not
# PyTorch's DDP class, so dynamo does not split for it: does its backward still launch buckets early?
# Records: `results/<...>/compile/records.jsonl`, made by the command in docs/ddp_core.md ("Under
# torch.compile"). Run: `python analysis/compile_overlap.py --records results/reference/x86_64-2cpu/compile`
# (the reference machine's records; the table goes to results/tables/, or to --out FOLDER).

# %%
from __future__ import annotations

import statistics
import sys

import pandas as pd

from analysis.common import chosen_records, save, script_main
from experiments.core.records import read_records


def bucket_timelines(record: dict) -> list[dict] | None:
    """Each rank's bucket timeline of the last measured iteration; None where the record has none
    (PyTorch's DDP: its reducer is C++)."""
    timelines = record.get("buckets")
    return None if not timelines or None in timelines else timelines


def first_launch_in_backward(record: dict) -> float | None:
    """Where in backward the first bucket's all-reduce was launched, in the last measured iteration: 0 at
    backward's start, 1 when its last gradient was computed (after 1: only once backward was done), the
    median over ranks; None without a bucket timeline."""
    timelines = bucket_timelines(record)
    if timelines is None:
        return None
    positions = []
    for rank, buckets in enumerate(timelines):
        forward, backward = record["phases_s"]["forward"][rank][-1], record["phases_s"]["backward"][rank][-1]
        first = min(launch for launch, _done in buckets.values() if launch is not None)
        positions.append((first - forward) / backward)
    return statistics.median(positions)


def median_of(values) -> float | None:
    """Median of the values that are numbers (PyTorch's last synchronised iteration has no exposed time)."""
    numbers = [v for v in values if v is not None]
    return statistics.median(numbers) if numbers else None


def row(record: dict) -> dict:
    """One config's latency, its rank 0 phases and, for ddp_core, where in backward its first bucket launched."""
    config, phases = record["config"], record["phases_s"]
    latency = pd.Series(record["latency_s"])
    timelines = bucket_timelines(record)
    return {
        "impl": config["impl"], "compile": config.get("compile", "none"), "model": config["model"],
        "bucket_mb": config["bucket_mb"], "iters": len(latency),
        "median_s": latency.median(), "p25_s": latency.quantile(0.25), "p75_s": latency.quantile(0.75),
        "backward_s": median_of(phases["backward"][0]), "exposed_comm_s": median_of(phases["exposed_comm"][0]),
        "buckets": None if timelines is None else len(timelines[0]),
        "first_launch_in_backward": first_launch_in_backward(record),
    }


def draw() -> None:
    """A table per config: latency, backward, exposed communication and the first bucket's launch."""
    path = chosen_records()
    table = pd.DataFrame([row(r) for r in read_records(path) if r.get("kind") == "run" and r["status"] == "ok"])
    save(None, table, "compile_overlap")
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(table.to_string(index=False))


def main(argv: list[str] | None = None) -> int:
    """`python analysis/compile_overlap.py [--records PATH] [--out FOLDER]`: draw(), or 2 without records."""
    return script_main(argv, draw, records="compile/records.jsonl",
                       make="`./ddpbench run --impl ddp_core,torch --compile none,default --out "
                            "results/compile/records.jsonl` (docs/ddp_core.md, \"Under torch.compile\")")


if __name__ == "__main__":
    sys.exit(main())
