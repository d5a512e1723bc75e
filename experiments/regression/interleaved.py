"""Interleaved A/B: several revisions' ddp_core in the same processes, taking turns iteration by iteration.

Why: on a shared machine a set of processes runs 10-30% faster or slower than the next set (the
cores' frequency, the host's other tenants; the drill's truth run at fe40d85 saw forward alone move
from 6.5 to 13.7 ms between process sets of the same commit). A/B rounds in fresh processes carry
that drift into every round's ratio. Here both revisions run in one set of processes, and their
turns alternate within seconds, so the drift hits both alike.

How: each revision's `ddp_core` package is imported from its worktree under a name of its own
(`ddp_core_<entry>`); each rank builds one replica of the config's model per entry (same seed, same
batch) wrapped in that entry's DistributedDataParallel, and warms each up. Then blocks: in each,
every entry runs one iteration, in an order shuffled anew per block (the same on every rank, so
collectives match), for about the given seconds. Iteration by iteration, because this machine's
speed drifts within seconds: one process timing ResNet-tiny alone (1 thread, 500 iterations;
benchmarks/iteration_noise.py) had a log sd of 0.14 per iteration but a lag-1 autocorrelation of
0.75 (BERT-tiny: 0.18, 0.65), so neighbouring iterations share most of their noise. Each block is a round: records are tagged with
the block index, so that compare pairs the entries block by block (stats.paired_ratio).

What it measures: only ddp_core differs between entries; the harness, the models and torch are this
tree's. A commit that changes anything else needs `ddpbench ab --interleave processes`.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import random
import sys
import time
from pathlib import Path
from types import ModuleType

from experiments.core.config import ConfigError, RunConfig

MIN_BLOCKS = 20  # however slow the config: fewer pairs than this say little


def load_ddp_core(tree: Path, alias: str) -> ModuleType:
    """Import `tree`/ddp_core as the package `alias` (its relative imports resolve inside it); an alias
    already imported from another tree is refused (it would measure that tree's code)."""
    package = Path(tree) / "ddp_core"
    if alias in sys.modules:
        if Path(sys.modules[alias].__file__).parent.resolve() != package.resolve():
            raise ImportError(f"{alias} is already imported from {sys.modules[alias].__file__}, not from {package}")
        return sys.modules[alias]
    spec = importlib.util.spec_from_file_location(alias, package / "__init__.py",
                                                  submodule_search_locations=[str(package)])
    if spec is None:
        raise ImportError(f"no ddp_core package in {tree}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[alias] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        for name in [n for n in sys.modules if n == alias or n.startswith(alias + ".")]:
            del sys.modules[name]
        raise
    return module


def measure_entries(rank: int, world_size: int, fields: dict, trees: dict[str, str], seconds: float,
                    seed: str, replicas: int = 1) -> dict[str, list[float]]:
    """On one rank: build `replicas` replicas per entry (name -> worktree), warm each up, then run blocks
    of one iteration per entry (block b on replica b mod `replicas`), in an order shuffled per block,
    for about `seconds` of measured iterations. Returns entry -> the seconds of its iteration in each
    block (the slowest rank's, gathered)."""
    import torch.distributed as dist

    from experiments.measure import harness

    config = RunConfig(**fields)
    modules = {name: load_ddp_core(Path(tree), f"ddp_core_{name}") for name, tree in trees.items()}
    # A replica runs a few percent faster or slower than another of the same code, depending on where
    # its memory landed; replicas per entry, built in turns in a shuffled order, average that out.
    trainees: dict[str, list] = {name: [] for name in trees}
    for copy in range(replicas):
        for name in random.Random(f"{seed}-build-{copy}").sample(list(trees), len(trees)):
            trainees[name].append(harness.build(rank, config, ddp_module=modules[name]))
    clock = harness.Clock(trainees[next(iter(trainees))][0].device)

    def iteration(t) -> float:
        clock.start()
        harness.train_step(t.ddp, t.family, t.batch, t.optimizer, True, clock.mark, t.precision)
        return clock.seconds()["optimizer"]

    last_warm = [[iteration(t) for _ in range(config.warmup)][-1] for copies in trainees.values() for t in copies]
    # How many blocks fit in `seconds`: rank 0's warm-up says, every rank follows (collectives must match).
    blocks = [max(MIN_BLOCKS, round(seconds * replicas / sum(last_warm)))]
    dist.broadcast_object_list(blocks, src=0)
    local: dict[str, list[float]] = {name: [] for name in trainees}
    for block in range(blocks[0]):
        for name in random.Random(f"{seed}-{block}").sample(list(trainees), len(trainees)):
            local[name].append(iteration(trainees[name][block % replicas]))
    # An iteration takes as long as its slowest rank: gather every entry's times in one go.
    slowest = harness.slowest_per_iteration([s for name in trainees for s in local[name]])
    return {name: slowest[i * blocks[0]:(i + 1) * blocks[0]] for i, name in enumerate(trainees)}


def preset_configs(grid: dict[str, list]) -> list[RunConfig]:
    """The validated configs of a preset's grid; ConfigError for one an interleaved A/B cannot run (only
    ddp_core differs between its entries)."""
    from experiments.measure.configs import check_network_available, resolve_grid

    configs = resolve_grid(grid)
    for config in configs:
        if config.impl not in ("ddp_core", "ddp_core_no_overlap") or config.compute != "real":
            raise ConfigError(f"impl={config.impl!r}, compute={config.compute!r}: an interleaved A/B measures "
                              "ddp_core with real compute only; use --interleave processes")
        if config.sync_every != 1 or config.warmup < 1:
            raise ConfigError(f"sync_every={config.sync_every}, warmup={config.warmup}: an interleaved A/B "
                              "synchronises every iteration and needs a warm-up (sync_every 1, warmup >= 1)")
    check_network_available(configs)  # a --link preset needs root and tc: refused here, not in a rank
    return configs


def run(trees: dict[str, Path], grid: dict[str, list], seconds: float, out_dir: Path, session: str,
        replicas: int = 1, timeout: float | None = None) -> None:
    """Run every config of the preset's `grid` once, all entries interleaved in one set of
    processes per config for about `seconds` of measured iterations (`replicas` replicas of the model
    per entry, see measure_entries); append each entry's iterations to
    out_dir/<entry>.jsonl, one record per block, as rounds of `session`
    (with `other_load`, the cores other processes kept busy meanwhile). Raises RankFailed /
    RanksTimedOut (a revision that cannot run) and ConfigError."""
    from experiments.core.machine import cpu_seconds, other_cores_busy
    from experiments.core.records import append_record
    from experiments.measure.launch import RankPool

    timeout = timeout or 900 + 20 * seconds  # building and warming the replicas, then the measured seconds
    out_dir.mkdir(parents=True, exist_ok=True)
    for config in preset_configs(grid):
        before, started = cpu_seconds(), time.monotonic()
        with RankPool(config.world_size, backend=config.backend, threads=config.threads, timeout=timeout,
                      link=config.link, ranks_per_host=config.ranks_per_host) as pool:
            per_rank = pool.run(measure_entries, (dataclasses.asdict(config), {n: str(t) for n, t in trees.items()},
                                                  seconds, session, replicas), timeout=timeout)
        after, wall = cpu_seconds(), time.monotonic() - started
        other = other_cores_busy(before, after, wall)
        for name, times in per_rank[0].items():
            for index, latency in enumerate(times):
                append_record(out_dir / f"{name}.jsonl", {
                    "kind": "run", "status": "ok", "config": dataclasses.asdict(config), "latency_s": [latency],
                    "round": {"session": session, "index": index, "other_load": other, "interleaved": True}})
