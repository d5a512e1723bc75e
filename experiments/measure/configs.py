"""The configs a sweep measures: the grid of typed values expanded into validated RunConfigs, each one
checked whole - its values (core.config), its model (can it be built, does it fit in memory) - before any
process starts."""
from __future__ import annotations

import dataclasses
import functools
import itertools
import os
from dataclasses import replace

from experiments.core.config import (
    LIST_PARAMS,
    ConfigError,
    RunConfig,
    check_config,
    default_backend_and_device,
    parse_list,
)
from experiments.core.machine import under_torchrun
from experiments.emulate import network
from experiments.measure.workloads import spec as model_spec


def grid_values(name: str, values: str | list) -> list:
    """One `run` parameter's values in its field's type: its comma-separated text parsed (parse_list), or
    values given as data (a plan's), whole numbers of a float field made floats as parsing their text makes them."""
    if isinstance(values, str):
        return parse_list(name, values)
    if LIST_PARAMS[name] in ("float", "float | str"):
        return [v if isinstance(v, str) else float(v) for v in values]
    return list(values)


def expand_grid(lists: dict[str, list]) -> list[RunConfig]:
    """The cartesian product of the given lists, in a stable order, each config validated."""
    unknown = set(lists) - set(LIST_PARAMS)
    if unknown:
        raise ConfigError(f"unknown parameter(s) {sorted(unknown)}; known: {sorted(LIST_PARAMS)}")
    names = list(lists)
    configs = [RunConfig(**dict(zip(names, combo))) for combo in itertools.product(*(lists[n] for n in names))]
    # --compute real,emulated --compute-profile P: the profile is the emulated configs' alone.
    configs = [replace(c, compute_profile="") if c.compute == "real" else c for c in configs]
    # PowerSGD's rank means nothing to other hooks: one config each, not one per rank.
    configs = [replace(c, powersgd_rank=1) if c.comm_hook != "powersgd" else c for c in configs]
    for config in configs:
        validate(config)
    # A user's file is identified by its content as well as its name (records, --resume, compare).
    configs = [dataclasses.replace(c, model_hash=model_info(c)["source_hash"]) for c in configs]
    # Group configs of one world size (and backend/device/network) together: they share one set of processes.
    configs.sort(key=lambda c: (c.backend, c.device, c.world_size, c.link, c.ranks_per_host, c.time_dilation))
    return list(dict.fromkeys(configs))  # drop duplicates, keep order


def resolve_grid(lists: dict[str, list]) -> list[RunConfig]:
    """The validated configs of a grid of `run` parameters, with the defaults that depend on the
    hardware: NCCL on CUDA where GPUs exist (else Gloo on the CPU), and threads that share this
    machine's cores among its ranks."""
    lists = dict(lists)
    backend, device = default_backend_and_device()
    lists.setdefault("backend", [backend])
    lists.setdefault("device", [device])
    configs = expand_grid(lists)
    if "threads" not in lists:
        local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", 0))  # under torchrun: the ranks on this host
        configs = [dataclasses.replace(c, threads=max(1, (os.cpu_count() or 1) // (local_ranks or c.world_size)))
                   for c in configs]
    return configs


def validate(config: RunConfig, gpu_count: int | None = None) -> None:
    """Raise ConfigError for the first invalid value of `config`, its model included."""
    check_config(config, gpu_count)
    check_memory(config, model_info(config)["parameters"])


@functools.lru_cache(maxsize=64)
def _model_info(model: str, model_config: str, image_size: int, seq_len: int) -> dict:
    try:
        return model_spec.check(model, model_config, image_size, seq_len)
    except ValueError as error:
        raise ConfigError(str(error)) from None


def model_info(config: RunConfig) -> dict:
    """What `check` knows of `config`'s model (parameters, file hash); ConfigError naming a bad spec."""
    if model_spec.kind(config.model) == "user":  # cheap, and its file may have changed: never cached
        return _model_info.__wrapped__(config.model, config.model_config, config.image_size, config.seq_len)
    return _model_info(config.model, config.model_config, config.image_size, config.seq_len)


BYTES_PER_PARAMETER = 16  # float32 weights, gradients, their bucket copies and SGD's momentum


def check_memory(config: RunConfig, parameters: int | None) -> None:
    """Refuse a CPU config whose ranks on this host could not even hold their weights, gradients, buckets
    and momentum in this machine's memory (activations come on top): it would swap or be killed."""
    if parameters is None or config.device != "cpu":
        return
    # Emulated hosts share this machine's memory; under torchrun only the local ranks do.
    ranks_here = int(os.environ.get("LOCAL_WORLD_SIZE", 0)) or config.world_size
    need = parameters * BYTES_PER_PARAMETER * ranks_here
    have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if need > have:
        raise ConfigError(f"--model={config.model!r} has {parameters / 1e6:,.0f} M parameters: {ranks_here} rank(s) "
                          f"need at least {need / 2**30:.0f} GiB for weights, gradients, buckets and momentum, and "
                          f"this machine has {have / 2**30:.0f} GiB; shrink it with --model-config (e.g. fewer "
                          "layers) or lower --world-size")


class SameOnEveryRank(ConfigError):
    """A bad input every rank of a torchrun job finds alike (it comes from the command line and
    torchrun's own settings): rank 0 alone reports it, so that the job says it once."""


def check_torchrun_job(jobs: list) -> None:
    """Under torchrun, refuse before any process group starts a grid that cannot run as one job: every
    config must have torchrun's world size (WORLD_SIZE) and all must share one backend."""
    if not under_torchrun():
        return
    world_size = int(os.environ["WORLD_SIZE"])
    mismatched = sorted({job.world_size for job in jobs if job.world_size != world_size})
    if mismatched:
        raise SameOnEveryRank(f"--world-size must be {world_size} under torchrun, torchrun's world size "
                              f"(nodes x processes per node); got {','.join(map(str, mismatched))}")
    backends = sorted({job.backend for job in jobs})
    if len(backends) > 1:
        raise SameOnEveryRank(f"--backend={','.join(backends)}: one backend per torchrun job; run one job per backend")


def check_network_available(jobs: list) -> None:
    """Refuse, before any process starts, jobs with a link where this machine cannot emulate one."""
    links = sorted({job.link for job in jobs if job.link != "none"})
    if not links:
        return
    if under_torchrun():
        raise ConfigError(f"--link={','.join(links)}: under torchrun the hosts are real; use --link none")
    problems = network.check()
    if problems:
        raise ConfigError(f"--link={','.join(links)} needs an emulated network, which this machine cannot make: "
                          f"{'; '.join(problems)}. --link none (loopback) works without it; "
                          "`ddpbench network --check` says more")


