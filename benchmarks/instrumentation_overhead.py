"""What the runner's instrumentation costs: the measured loop against an uninstrumented one.

Both loops run the same `train_step` on the same model in the same processes, in alternating blocks;
the instrumented one adds what `ddpbench run` adds (phase marks, the reducer observer with per-bucket
launch and completion times, a device synchronisation before each clock read). An iteration's latency
is the slowest rank's. Prints and writes the ratio of medians with a bootstrap 95% confidence interval.

    python benchmarks/instrumentation_overhead.py --out results/benchmarks/instrumentation_overhead-cpu.json
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from experiments.core.config import RunConfig
from experiments.core.machine import environment  # noqa: E402
from experiments.core.stats import ratio_of_medians  # noqa: E402
from experiments.measure.configs import validate  # noqa: E402
from experiments.measure.harness import BucketTimes, Clock, build, slowest_per_iteration, train_step  # noqa: E402
from experiments.measure.launch import run_ranks  # noqa: E402


def alternate(rank: int, world_size: int, fields: dict, rounds: int, iters: int) -> dict:
    """On one rank: blocks of plain and instrumented iterations, alternating; per-iteration seconds."""
    config = RunConfig(**fields)
    t = build(rank, config)
    clock = Clock(t.device)
    observer = BucketTimes(clock)
    samples: dict[str, list[float]] = {"plain": [], "instrumented": []}
    for _ in range(config.warmup):
        train_step(t.ddp, t.family, t.batch, t.optimizer, True)
    for round_index in range(rounds):
        for kind in (("plain", "instrumented") if round_index % 2 == 0 else ("instrumented", "plain")):
            t.ddp.reducer.observer = observer if kind == "instrumented" else None
            dist.barrier()
            local = []
            for _ in range(iters):
                if kind == "plain":
                    start = time.perf_counter()
                    train_step(t.ddp, t.family, t.batch, t.optimizer, True)
                    local.append(time.perf_counter() - start)
                else:
                    observer.buckets = {}
                    clock.start()
                    train_step(t.ddp, t.family, t.batch, t.optimizer, True, clock.mark)
                    local.append(clock.seconds()["optimizer"])
            samples[kind].extend(slowest_per_iteration(local))
    return samples


def main() -> None:
    """Parse arguments, measure, print and write the result."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    config = RunConfig(model=args.model, impl="ddp_core", image_size=args.image_size, batch_size=args.batch_size,
                       world_size=args.world_size, warmup=args.warmup, threads=1)
    validate(config)
    samples = run_ranks(alternate, args.world_size, args=(dataclasses.asdict(config), args.rounds, args.iters),
                        threads=1, timeout=3600)[0]
    ratio = ratio_of_medians(samples["instrumented"], samples["plain"])
    medians = {k: statistics.median(v) for k, v in samples.items()}
    print(f"{args.model}: plain {medians['plain']:.4f} s, instrumented {medians['instrumented']:.4f} s, "
          f"ratio {ratio['ratio']:.4f} [{ratio['ci'][0]:.4f}, {ratio['ci'][1]:.4f}] (goal <= 1.01)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"config": dataclasses.asdict(config), "rounds": args.rounds, "iters": args.iters,
                                    "samples_s": samples, "median_s": medians, "ratio": ratio,
                                    "env": environment(threads=1)}, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
