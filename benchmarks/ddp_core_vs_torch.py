"""Per-iteration latency of ddp_core against PyTorch's DDP, measured side by side in one job.

Every implementation trains its own copy of the model in the same processes; they take turns one
iteration at a time (A B C D E, then B C D E A, ...), so that drift of a shared, noisy machine hits all
of them alike and neighbouring samples of one implementation are not correlated by it.
An iteration's latency is the slowest rank's. Also times the pass that copies all gradients out of their
buckets (what bucket views save).

Each model is measured in several launches, each in fresh rank processes: how fast one implementation
runs also depends on where its memory landed in those processes (by a few percent for BERT-base), which
no number of rounds within one launch averages out. A ratio is the geometric mean over launches of each
launch's ratio of medians, with a Student t 95% interval over launches. Writes raw samples (per launch),
medians and ratios as one JSON file.

    python benchmarks/ddp_core_vs_torch.py --out results/benchmarks/ddp_core_vs_torch-cpu.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as TorchDDP

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ddp_core import DistributedDataParallel, GradBucket  # noqa: E402
from experiments.core.machine import environment  # noqa: E402
from experiments.core.stats import paired_ratio  # noqa: E402
from experiments.measure.harness import slowest_per_iteration  # noqa: E402
from experiments.measure.launch import run_ranks  # noqa: E402
from experiments.measure.workloads import workload  # noqa: E402

# name -> (wrapper, keyword arguments)
IMPLS = {
    "ddp_core": (DistributedDataParallel, {}),
    "ddp_core_view": (DistributedDataParallel, {"gradient_as_bucket_view": True}),
    "ddp_core_no_overlap": (DistributedDataParallel, {"overlap": False}),
    "torch": (TorchDDP, {}),
    "torch_view": (TorchDDP, {"gradient_as_bucket_view": True}),
}
# (numerator, denominator, goal): the ratios of median latency printed and stored.
RATIOS = [
    ("ddp_core", "torch", None),
    ("ddp_core_view", "torch_view", "<= 1.00"),
    ("ddp_core_view", "torch", "< 0.97"),
    ("ddp_core_no_overlap", "ddp_core", None),
    ("torch_view", "torch", None),  # what bucket views gain PyTorch itself
    # The share of PyTorch's default iteration that bucket views can save at most (see `copy_out_pass`).
    ("copy_out_pass", "torch", None),
]
COPY_PASSES = 20


def copy_out_pass(model: torch.nn.Module, passes: int) -> list[float]:
    """Slowest rank's seconds per pass that copies every gradient out of a flat bucket into its own tensor.

    This is the one pass over the gradients that `gradient_as_bucket_view` saves against PyTorch's defaults:
    the copy into the bucket happens either way, because zero_grad() frees .grad and autograd hands over a
    fresh tensor each iteration. Its share of an iteration bounds what bucket views can gain.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    views = GradBucket(0, params, list(range(len(params))), is_last=True).views  # one bucket, ddp_core's layout
    grads = [torch.zeros_like(p) for p in params]
    seconds = []
    for _ in range(passes):
        dist.barrier()  # both ranks copy at once, sharing memory bandwidth as in a real iteration
        start = time.perf_counter()
        torch._foreach_copy_(grads, views)
        seconds.append(time.perf_counter() - start)
    return slowest_per_iteration(seconds)


def measure(rank: int, world_size: int, args: argparse.Namespace) -> dict:
    """On one rank: per-iteration latencies of every implementation, interleaved over rounds."""
    family = workload(args.model)
    batch_size = args.batch_size
    batch = family.make_batch(family.MODELS[args.model](), batch_size, args.image_size, args.seq_len,
                              torch.Generator().manual_seed(rank))
    runs = {}
    for name, (wrapper, kwargs) in IMPLS.items():
        torch.manual_seed(0)
        model = family.MODELS[args.model]()
        ddp = wrapper(model, bucket_cap_mb=args.bucket_mb, **kwargs)
        runs[name] = (ddp, torch.optim.SGD(ddp.parameters(), lr=1e-4))

    def step(name: str) -> float:
        ddp, optimizer = runs[name]
        start = time.perf_counter()
        # set_to_none (the default) for all: autograd's fresh gradient is copied into the bucket once;
        # with bucket views nothing is copied back, and zeroing views would cost a pass of its own.
        optimizer.zero_grad()
        family.loss(ddp, batch).backward()
        optimizer.step()
        return time.perf_counter() - start  # CPU only: nothing asynchronous is left to synchronise

    for name in IMPLS:  # warm-up, including each DDP's bucket rebuild after its first iteration
        for _ in range(args.warmup):
            step(name)
    samples: dict[str, list[float]] = {name: [] for name in IMPLS}
    names = list(IMPLS)
    for round_index in range(args.rounds):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            dist.barrier()  # start each block together, so no rank's wait is counted as DDP time
            samples[name].extend(slowest_per_iteration([step(name) for _ in range(args.iters)]))
    samples["copy_out_pass"] = copy_out_pass(runs["torch"][0].module, COPY_PASSES)
    return samples


def main() -> None:
    """Parse arguments, run every model, print a table and write the JSON file."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="resnet50,bert-base")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--launches", type=int, default=4, help="fresh sets of rank processes per model (>= 2)")
    parser.add_argument("--rounds", type=int, default=25, help="rounds per launch")
    parser.add_argument("--iters", type=int, default=1, help="measured iterations per implementation per round")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--bucket-mb", type=float, default=25)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--resnet-batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--bert-batch", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1, help="compute threads per rank")
    parser.add_argument("--timeout", type=float, default=3600)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    for flag in ("world_size", "rounds", "iters", "threads"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    if args.launches < 2:
        parser.error(f"--launches must be >= 2 (the interval is taken over launches), got {args.launches}")
    models = args.models.split(",")
    for model in models:
        workload(model)  # unknown names fail here, before any process starts

    report = {"config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
              "env": environment(threads=args.threads), "models": {}}
    for model in models:
        model_args = argparse.Namespace(**vars(args), model=model,
                                        batch_size=args.resnet_batch if model.startswith("resnet") else args.bert_batch)
        launches = [run_ranks(measure, args.world_size, args=(model_args,), threads=args.threads,
                              timeout=args.timeout)[0] for _ in range(args.launches)]
        samples = {name: [launch[name] for launch in launches] for name in launches[0]}  # name -> launch -> samples
        medians = {name: statistics.median(x for launch in s for x in launch) for name, s in samples.items()}
        ratios = {f"{a}/{b}": {**paired_ratio(samples[a], samples[b], confidence=0.95), "goal": goal}
                  for a, b, goal in RATIOS}
        report["models"][model] = {"batch_size": model_args.batch_size, "samples_s": samples,
                                   "median_s": medians, "ratios": ratios}
        print(f"{model}: " + ", ".join(f"{n} {m:.3f} s" for n, m in medians.items()))
        for key, r in ratios.items():
            goal = f" (goal {r['goal']})" if r["goal"] else ""
            per_launch = " ".join(f"{x:.3f}" for x in r["round_ratios"])
            print(f"  {key}: {r['ratio']:.3f} [{r['ci'][0]:.3f}, {r['ci'][1]:.3f}]{goal}; launches: {per_launch}")
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1) + "\n")  # after each model: keep what is measured
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
