"""What `ddpbench advise` measures besides the profile, in the same one-process world(s):

- which parameters get no gradient (a model that needs `find_unused_parameters`);
- the cost of `find_unused_parameters`: forward with and without ddp_core's graph search;
- the cost or saving of `gradient_as_bucket_view`: whole synchronised iterations with and without it;
- the cost of an fp16/bf16 compression hook's casts: all gradient bytes to 16 bits and back.

Variants are timed in alternation (A, B, A, B, ...) so that a drift of the machine hits both alike.
"""
from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

import ddp_core
from experiments.core.config import RunConfig
from experiments.measure.harness import build, train_step
from experiments.measure.workloads.base import model_size


def _seconds(fn, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()  # a sync point: the work queued above is what is timed
    return time.perf_counter() - start


def _alternate(variants: dict, rounds: int, warmup: int, device: torch.device) -> dict[str, list[float]]:
    """Time each variant `rounds` times, in alternation, after `warmup` untimed rounds."""
    samples = {name: [] for name in variants}
    for i in range(warmup + rounds):
        for name, fn in variants.items():
            seconds = _seconds(fn, device)
            if i >= warmup:
                samples[name].append(seconds)
    return samples


def unused_parameters(model: torch.nn.Module, family, batch: dict, precision) -> list[str]:
    """Names of trainable parameters that receive no gradient from one forward and backward."""
    model.zero_grad(set_to_none=True)
    with precision.autocast():
        loss = family.loss(model, batch)
    loss.backward()
    unused = [name for name, p in model.named_parameters() if p.requires_grad and p.grad is None]
    model.zero_grad(set_to_none=True)
    return unused


def measure(rank: int, world_size: int, config_fields: dict) -> dict:
    """On each copy (a world of one), the probes above; returns raw samples in seconds."""
    config = RunConfig(**config_fields)
    alone = dist.new_subgroups(group_size=1)[0] if world_size > 1 else None
    group = alone or dist.group.WORLD
    try:
        t = build(rank, config, alone)  # ddp_core with the run's defaults: views off, no search
        unused = unused_parameters(t.model, t.family, t.batch, t.precision)
        rounds, warmup = config.iters, config.warmup
        result = {"unused": unused, "model_size": model_size(t.model)}
        if not unused:  # whole iterations need every gradient (without the search)
            torch.manual_seed(config.seed)
            twin = t.family.build().to(t.device)  # the same weights, in its own DDP with bucket views
            views = ddp_core.DistributedDataParallel(twin, process_group=group, gradient_as_bucket_view=True,
                                                     bucket_cap_mb=config.bucket_mb)
            twin_optimizer = torch.optim.SGD(views.parameters(), lr=1e-3, momentum=0.9)
            result["iteration"] = _alternate(
                {"copies": lambda: train_step(t.ddp, t.family, t.batch, t.optimizer, True, precision=t.precision),
                 "views": lambda: train_step(views, t.family, t.batch, twin_optimizer, True, precision=t.precision)},
                rounds, warmup, t.device)
        # find_unused_parameters: forward only (the search runs at its end). It comes last: a second DDP
        # over the same parameters adds its gradient hooks to them, which no backward may meet later.
        searching = ddp_core.DistributedDataParallel(t.model, process_group=group, find_unused_parameters=True,
                                                     bucket_cap_mb=config.bucket_mb)

        def forward(ddp):
            with t.precision.autocast():
                t.family.loss(ddp, t.batch)

        result["forward"] = _alternate({"plain": lambda: forward(t.ddp), "search": lambda: forward(searching)},
                                       rounds, warmup, t.device)
        flat = torch.randn(sum(p.numel() for p in t.model.parameters() if p.requires_grad), device=t.device)
        result["cast"] = _alternate({dtype: (lambda d=getattr(torch, dtype): flat.to(d).to(torch.float32))
                                     for dtype in ("float16", "bfloat16")}, 5, 1, t.device)
        return result
    finally:
        if alone is not None:
            dist.destroy_process_group(alone)


def medians(result: dict) -> dict:
    """The probes' medians (seconds) and the unused parameters."""
    return {"unused": result["unused"],
            **{f"{probe}_{name}_s": statistics.median(samples) for probe in ("forward", "iteration", "cast")
               for name, samples in result.get(probe, {}).items()}}
