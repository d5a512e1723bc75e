"""The one-process profile the performance model starts from (`ddpbench profile`).

One rank (world size 1) trains the model with ddp_core, reducing only after backward, so that
backward is pure computation plus the copies into buckets. ddp_core's reducer observer reports the
moment each gradient is in its bucket; with the forward, backward, tail (waiting and writing back)
and optimizer times, and every gradient's size, that is all the simulation needs. Iterations under
`no_sync()` (skip-sync, E5) are measured separately: their backward neither copies nor reduces.
Raw samples are kept; the model uses their medians.

Ranks that share a host (several CPU ranks on one machine) compete for its cores, caches and memory
bandwidth, so one rank computes more slowly than a process alone does. A profile can therefore run
as N co-located copies at once (`--colocated N`, stored as the record's world_size): N independent
processes, each a world of one, profiling together; the record keeps the slowest copy's samples,
since a synchronised job runs at its slowest rank's pace, and every copy's median.
"""
from __future__ import annotations

import dataclasses
import statistics

import torch
import torch.distributed as dist

from experiments.core.config import RunConfig
from experiments.measure.harness import Clock, build, train_step
from experiments.measure.memory import PeakMemory
from experiments.measure.workloads.base import model_size


class ReadyTimes:
    """Reducer observer: a clock mark per gradient as it arrives, and one when backward compute ends."""

    def __init__(self, clock: Clock):
        self.clock = clock

    def parameter_ready(self, index: int) -> None:
        """Mark gradient `index` (a CUDA event on the producing stream, on GPUs)."""
        self.clock.mark(f"ready{index}")

    def bucket_launched(self, index: int, future: torch.futures.Future) -> None:
        """Nothing to record: at world size 1 the all-reduce is not what is profiled."""

    def backward_computed(self) -> None:
        """Mark the end of backward computation."""
        self.clock.mark("backward_computed")

    def gradients_synchronised(self) -> None:
        """Nothing to mark: backward() returns right after this."""


def profile_config(config: RunConfig, colocated: int = 1) -> RunConfig:
    """The config that profiles `config`'s model, inputs and threads in `colocated` processes at once."""
    return dataclasses.replace(config, world_size=colocated, impl="ddp_core_no_overlap", bucket_mb=25.0, sync_every=1,
                               process_groups=1, comm_hook="none")


def measure(rank: int, world_size: int, config_fields: dict) -> dict:
    """On each copy, a world of one: warm up, then time `iters` synchronised and `iters` no_sync iterations."""
    alone = dist.new_subgroups(group_size=1)[0] if world_size > 1 else None  # each copy reduces only with itself
    try:
        return _profile(rank, RunConfig(**config_fields), alone)
    finally:
        if alone is not None:
            dist.destroy_process_group(alone)  # a pool profiles config after config: leave no group behind


def _profile(rank: int, config: RunConfig, alone) -> dict:
    t = build(rank, config, alone)
    clock = Clock(t.device)
    t.ddp.reducer.observer = ReadyTimes(clock)
    n_params = len(t.ddp.reducer.params)
    synced, skipped = [], []
    memory = PeakMemory(t.device)
    for i in range(config.warmup + config.iters):
        if i == config.warmup:
            memory.reset()  # the peak of the measured synchronised iterations (a pool profiles config after config)
        clock.start()
        train_step(t.ddp, t.family, t.batch, t.optimizer, True, clock.mark, t.precision)
        m = clock.seconds()
        if i >= config.warmup:
            synced.append({"forward": m["forward"], "backward": m["backward_computed"] - m["forward"],
                           "tail": m["backward"] - m["backward_computed"], "optimizer": m["optimizer"] - m["backward"],
                           "ready": [m[f"ready{p}"] - m["forward"] for p in range(n_params)]})
    peak = memory.read()  # before the skipped iterations, which hold no buckets in flight
    for i in range(config.warmup + config.iters):
        clock.start()
        train_step(t.ddp, t.family, t.batch, t.optimizer, False, clock.mark, t.precision)
        m = clock.seconds()
        t.optimizer.zero_grad(set_to_none=True)  # each skipped iteration starts as the first of a cycle
        if i >= config.warmup:
            skipped.append({"forward": m["forward"], "backward": m["backward"] - m["forward"]})
    reducer = t.ddp.reducer
    return {
        "synced": synced, "skipped": skipped,
        "names": reducer.names,
        "bytes": [p.numel() * p.element_size() for p in reducer.params],
        "dtypes": [str(p.dtype) for p in reducer.params],
        "buffer_bytes": sum(b.numel() * b.element_size() for b in t.model.buffers()),
        "model_size": model_size(t.model),
        "memory": peak,
    }


PROFILE_PHASES = ("forward", "backward", "tail", "optimizer")


def _p50(result: dict) -> float:
    """A copy's median synchronised iteration."""
    return statistics.median(sum(row[phase] for phase in PROFILE_PHASES) for row in result["synced"])


def make_record(config: RunConfig, per_rank: list[dict], wall_s: float) -> dict:
    """The profile record: the slowest copy's raw samples per iteration, the gradients' names, sizes
    and dtypes, every copy's median, and the other copies' raw samples."""
    slowest = max(range(len(per_rank)), key=lambda rank: _p50(per_rank[rank]))
    result = per_rank[slowest]
    summary = {phase: statistics.median(row[phase] for row in result["synced"]) for phase in PROFILE_PHASES}
    summary.update(p50=_p50(result), copies_p50=[_p50(r) for r in per_rank])
    others = [{k: r[k] for k in ("synced", "skipped")} for rank, r in enumerate(per_rank) if rank != slowest]
    if all("memory" in r for r in per_rank):  # (the largest copy's peak; memory.py says how it was measured)
        result = {**result, "memory": max((r["memory"] for r in per_rank), key=lambda m: m["peak_mb"])}
    return {"kind": "profile", "status": "ok", "config": dataclasses.asdict(config), "summary": summary, **result,
            "slowest_copy": slowest, "other_copies": others, "timing": {"config_wall_s": wall_s}}
