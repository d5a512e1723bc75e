"""The command line of `ddpbench profile`: one-process profiles (and interference probes) for the
performance model (the measuring: profiler.py, interference.py).

    ddpbench profile --model resnet50,bert-base --image-size 32 --seq-len 16 --batch-size 2 --out P.jsonl
    ddpbench profile --model resnet50 --colocated 1,2 --out P.jsonl    # also as 2 ranks sharing this host
"""
from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from pathlib import Path

from experiments.core.config import ConfigError, RunConfig, default_backend_and_device, parse_ints, validate_backend
from experiments.measure.configs import expand_grid, grid_values

# The RunConfig fields `ddpbench profile` takes (model_config: ';' between configurations, as in `run`).
PROFILED = ("model", "batch_size", "image_size", "seq_len", "threads", "iters", "warmup", "device", "model_config", "amp")


@dataclass(frozen=True)
class ProfileOptions:
    """What `ddpbench profile` profiles and where its records go (its flags, typed). A list option takes its
    comma-separated text (model_config: ';' between configurations) or the values themselves; None: RunConfig's
    default (device: the hardware's, threads: 1)."""

    out: Path
    model: str | list[str] | None = None
    batch_size: str | list[int] | None = None
    image_size: str | list[int] | None = None
    seq_len: str | list[int] | None = None
    threads: str | list[int] | None = None
    iters: str | list[int] | None = None
    warmup: str | list[int] | None = None
    device: str | list[str] | None = None
    model_config: str | list[str] | None = None
    amp: str | list[str] | None = None
    colocated: str | list[int] = "1"
    interference_probe: str = "on"
    resume: bool = False
    timeout: float = 600.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`ddpbench profile`: what to profile (one process, world size 1)."""
    for name in PROFILED:
        parser.add_argument(f"--{name.replace('_', '-')}", dest=name, metavar="LIST",
                            help="key=value,... for --model; several configurations separated by ';'"
                            if name == "model_config" else f"comma-separated; default {getattr(RunConfig(), name)!r}")
    parser.add_argument("--colocated", default="1", metavar="LIST",
                        help="comma-separated; profile N independent copies at once, as N ranks sharing this host "
                        "compute (default 1: one process alone)")
    parser.add_argument("--interference-probe", default="on", metavar="on|off",
                        help="after the profiles, probe each model's interference (its backward alone and beside an "
                        "all-reduce of its gradient bytes, and on a CPU DDP's backward with overlap and without; 2 "
                        "ranks; seconds) into --out (default on)")


def main(options: ProfileOptions) -> int:
    """`ddpbench profile`: profile every config not yet recorded in --out, then probe (see command.measure_jobs)."""
    from experiments.measure.command import measure_jobs

    return measure_jobs("profile", options.out, options.resume, options.timeout, lambda: resolve(options),
                        lambda configs: run(configs, options))


def resolve(options: ProfileOptions) -> list[RunConfig]:
    """The configs to profile (world size = co-located copies, each a world of one), validated."""
    from experiments.perfmodel.profiler import profile_config  # imports torch: not to parse the options

    _, default_device = default_backend_and_device()
    lists = {name: grid_values(name, getattr(options, name)) for name in PROFILED if getattr(options, name) is not None}
    lists.setdefault("device", [default_device])
    lists.setdefault("threads", [1])  # as the main job's runs: one compute thread per rank
    colocated = parse_ints("colocated", options.colocated, 1)
    configs = [dataclasses.replace(profile_config(c, n), backend="nccl" if c.device == "cuda" else "gloo")
               for c in expand_grid({**lists, "world_size": [1]}) for n in colocated]
    for config in configs:  # co-located GPU copies need a GPU each
        validate_backend(config.backend, config.device, config.world_size)
    if options.interference_probe not in ("on", "off"):
        raise ConfigError(f"--interference-probe={options.interference_probe!r} is not allowed; choose on or off")
    return configs


def probes_of(configs: list[RunConfig]) -> list:
    """One interference probe per profiled model and inputs, with the ranks this host gives it."""
    from experiments.perfmodel.interference import probe_config, ranks_here

    return list(dict.fromkeys(probe_config(c, ranks_here(c.device)) for c in configs))


def run(configs: list[RunConfig], options: ProfileOptions) -> dict:
    """Profile every config not yet recorded (see sweep.run_jobs)."""
    from experiments.measure.sweep import run_jobs
    from experiments.perfmodel.profiler import make_record, measure

    counts = run_jobs(configs, options.out, measure, make_record, "profile", resume=options.resume,
                      timeout=options.timeout)
    if options.interference_probe == "on":
        from experiments.perfmodel.interference import run_probes

        probed = run_probes(probes_of(configs), options.out, resume=options.resume, timeout=options.timeout)
        counts = {key: counts[key] + probed[key] for key in counts}
    return counts
