"""How noisy is one iteration on this machine, and how fast does the noise move?

Times plain training iterations (no DDP, no communication: forward, backward, SGD step) of the smoke
preset's models in one process with one thread, and reports per model the spread of log latencies,
their lag-1 autocorrelation, and the spread of the difference of neighbouring iterations. A high
autocorrelation means the machine's speed drifts slowly compared with an iteration: comparing two
revisions iteration by iteration in one process (experiments/regression/interleaved.py) then cancels
most of the noise that separate runs or rounds carry. Writes the raw samples and the figures as JSON.

    python benchmarks/iteration_noise.py --out results/benchmarks/iteration_noise-x86_64-2cpu.json
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from experiments.core.machine import environment  # noqa: E402
from experiments.measure.workloads.spec import load  # noqa: E402

MODELS = ("resnet-tiny", "bert-tiny")  # at the smoke preset's sizes: images 16, sequences 64, batch 4


def iteration_seconds(model_name: str, iterations: int, warmup: int) -> list[float]:
    """Seconds of each measured training iteration of `model_name` in this process."""
    family = load(model_name, "", 16, 64, "")
    torch.manual_seed(0)
    model = family.build()
    batch = family.make_batch(model, 4, 16, 64, torch.Generator().manual_seed(0))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    times = []
    for _ in range(warmup + iterations):
        started = time.perf_counter()
        family.loss(model, batch).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - started)
    return times[warmup:]


def noise_figures(seconds: list[float], block: int = 10) -> dict:
    """Spread of log latencies, lag-1 autocorrelation, spread of neighbour differences (per iteration,
    i.e. divided by sqrt 2) and the spread of medians of consecutive blocks of `block` iterations."""
    logs = np.log(seconds)
    medians = [np.median(logs[i:i + block]) for i in range(0, len(logs) - block + 1, block)]
    return {"median_ms": float(np.median(seconds) * 1e3), "log_sd": float(np.std(logs, ddof=1)),
            "lag1_autocorrelation": float(np.corrcoef(logs[:-1], logs[1:])[0, 1]),
            "neighbour_difference_sd": float(np.std(np.diff(logs), ddof=1) / np.sqrt(2)),
            f"block{block}_median_sd": float(np.std(medians, ddof=1))}


def main() -> None:
    """Measure every model, print the figures, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--iterations", type=int, default=500)
    parser.add_argument("--warmup", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)
    result = {"env": environment(threads=1), "iterations": args.iterations, "models": {}}
    for name in MODELS:
        seconds = iteration_seconds(name, args.iterations, args.warmup)
        result["models"][name] = {**noise_figures(seconds), "seconds": seconds}
        figures = {k: round(v, 3) for k, v in result["models"][name].items() if k != "seconds"}
        print(name, figures, flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
