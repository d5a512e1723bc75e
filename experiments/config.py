"""One typed config per measured run, the grid that expands CLI lists into configs, and validation.

Validation happens here, before any process starts: each error names the parameter, the value and
what is allowed.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import os
from dataclasses import dataclass, fields, replace

from ddp_core.hooks import HOOKS

from . import network
from .workloads import spec as model_spec

IMPLS = ("ddp_core", "ddp_core_no_overlap", "torch")
COMPUTE = ("real", "emulated")
BACKENDS = ("nccl", "gloo", "mpi")
DEVICES = ("cpu", "cuda")
AMPS = ("none", "bf16", "fp16")


class ConfigError(ValueError):
    """An invalid parameter value; the message names the parameter, the value and what is allowed."""


@dataclass(frozen=True)
class RunConfig:
    """Everything that defines one measured configuration; stored, resolved, next to its results."""

    model: str = "resnet-tiny"
    backend: str = "gloo"
    device: str = "cpu"
    world_size: int = 2
    bucket_mb: float = 25.0
    sync_every: int = 1
    impl: str = "ddp_core"
    process_groups: int = 1
    comm_hook: str = "none"
    batch_size: int = 8
    image_size: int = 64
    seq_len: int = 32
    iters: int = 10
    warmup: int = 3
    seed: int = 0
    threads: int = 1
    link: str = "none"  # `none`: loopback; a rate (`1gbit`): each rank group on an emulated host behind a link
    ranks_per_host: int = 1
    # --- the user's own model (issue 15) ---
    model_config: str = ""  # key=value,... for torchvision:/transformers:/user models (see workloads/spec.py)
    amp: str = "none"  # autocast in forward: none, bf16, fp16 (with a gradient scaler; CUDA only)
    model_hash: str = ""  # sha256 (16 hex digits) of a user's workload file: set from the file, never given
    compute: str = "real"  # `emulated`: a stand-in waits for the times of --compute-profile (workloads/emulated.py)
    compute_profile: str = ""  # a `ddpbench profile` record file; used by emulated configs only
    time_dilation: float = 1.0  # K: links at rate / K and emulated compute K times longer; records undilate


# Parameters the CLI accepts as comma-separated lists, with their element types (model_hash: derived).
LIST_PARAMS = {f.name: f.type for f in fields(RunConfig) if f.name != "model_hash"}
_TYPES = {"str": str, "int": int, "float": float}


def parse_list(name: str, text: str) -> list:
    """Parse `--name a,b,c` into typed values, naming the parameter if one does not parse."""
    kind = _TYPES[LIST_PARAMS[name]]
    values = []
    # A model configuration holds commas itself (key=value,key=value): several are separated by ';'.
    for item in text.split(";" if name == "model_config" else ","):
        item = item.strip().lower() if name == "link" else item.strip()  # tc's units: 1gbit, 1Gbit, 1GBIT
        try:
            values.append(kind(item))
        except ValueError:
            raise ConfigError(f"--{_flag(name)}: {item!r} is not a valid {kind.__name__}") from None
    if name == "model_config":
        return values  # "" is allowed: the defaults
    if not values or any(v == "" for v in values):
        raise ConfigError(f"--{_flag(name)}: {text!r} holds an empty value")
    return values


def expand_grid(lists: dict[str, list]) -> list[RunConfig]:
    """The cartesian product of the given lists, in a stable order, each config validated."""
    unknown = set(lists) - set(LIST_PARAMS)
    if unknown:
        raise ConfigError(f"unknown parameter(s) {sorted(unknown)}; known: {sorted(LIST_PARAMS)}")
    names = list(lists)
    configs = [RunConfig(**dict(zip(names, combo))) for combo in itertools.product(*(lists[n] for n in names))]
    # --compute real,emulated --compute-profile P: the profile is the emulated configs' alone.
    configs = [replace(c, compute_profile="") if c.compute == "real" else c for c in configs]
    for config in configs:
        validate(config)
    # A user's file is identified by its content as well as its name (records, --resume, compare).
    configs = [dataclasses.replace(c, model_hash=model_info(c)["source_hash"]) for c in configs]
    # Group configs of one world size (and backend/device/network) together: they share one set of processes.
    configs.sort(key=lambda c: (c.backend, c.device, c.world_size, c.link, c.ranks_per_host, c.time_dilation))
    return list(dict.fromkeys(configs))  # drop duplicates, keep order


def validate(config: RunConfig, gpu_count: int | None = None) -> None:
    """Raise ConfigError for the first invalid value of `config`."""
    _one_of("amp", config.amp, AMPS)
    if config.amp == "fp16" and config.device != "cuda":
        raise ConfigError("--amp fp16 needs --device cuda: float16 training needs a gradient scaler, which "
                          "ddpbench uses on GPUs only, and CPUs compute float16 slowly; use --amp bf16 on the CPU")
    _one_of("impl", config.impl, IMPLS)
    _one_of("comm-hook", config.comm_hook, ["none", *HOOKS])
    for name, minimum in (("world_size", 1), ("sync_every", 1), ("process_groups", 1), ("batch_size", 1),
                          ("image_size", 8), ("seq_len", 2), ("iters", 1), ("warmup", 0), ("threads", 1)):
        value = getattr(config, name)
        if value < minimum:
            raise ConfigError(f"--{_flag(name)}={value} is not allowed; it must be >= {minimum}")
    if config.iters % config.sync_every:
        raise ConfigError(f"--iters={config.iters} must be a multiple of --sync-every={config.sync_every}, so that "
                          "every measured window holds whole cycles of skipped and synchronised iterations")
    if config.bucket_mb < 0:
        raise ConfigError(f"--bucket-mb={config.bucket_mb} is not allowed; it must be >= 0 (0 = one parameter per bucket)")
    validate_network(config.link, config.ranks_per_host, config.world_size)
    validate_compute(config)
    check_memory(config, model_info(config)["parameters"])  # (after the sizes: the check runs the model on them)
    if config.impl == "torch" and (config.process_groups > 1):
        raise ConfigError("--process-groups > 1 needs --impl ddp_core or ddp_core_no_overlap (PyTorch's DDP takes one group)")
    validate_backend(config.backend, config.device, config.world_size, gpu_count)


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


def validate_network(link: str, ranks_per_host: int, world_size: int | None = None) -> None:
    """Raise ConfigError unless `link` is `none` or a rate, and `ranks_per_host` fits it (and `world_size`)."""
    if link != "none":
        try:
            network.parse_rate(link)
        except ValueError as error:
            raise ConfigError(f"--link={link!r} is not allowed: {error}") from None
    if ranks_per_host < 1:
        raise ConfigError(f"--ranks-per-host={ranks_per_host} is not allowed; it must be >= 1")
    if link == "none" and ranks_per_host != 1:
        raise ConfigError(f"--ranks-per-host={ranks_per_host} needs --link with a rate (with --link none every "
                          "rank is on this one host)")
    if world_size is not None and ranks_per_host > world_size:
        # (= world size is one host: the baseline that E4 compares two hosts with)
        raise ConfigError(f"--ranks-per-host={ranks_per_host} is more than --world-size={world_size}; it must be "
                          f"at most the world size ({world_size} puts every rank on one host)")


def validate_compute(config: RunConfig) -> None:
    """Raise ConfigError unless the compute mode, its profile and the time dilation fit together."""
    _one_of("compute", config.compute, COMPUTE)
    if not config.time_dilation >= 1:
        raise ConfigError(f"--time-dilation={config.time_dilation:g} is not allowed; it must be >= 1 (K times slower)")
    if config.compute == "real":
        if config.time_dilation != 1:
            raise ConfigError(f"--time-dilation={config.time_dilation:g} needs --compute emulated (real compute "
                              "cannot be slowed down K times)")
        return
    if not config.compute_profile:
        raise ConfigError("--compute emulated needs --compute-profile FILE (a `ddpbench profile` record of the model)")
    from .workloads.emulated import ComputeProfileError, load_compute_profile

    try:
        load_compute_profile(config.compute_profile, config.model, config.world_size)
    except ComputeProfileError as error:
        raise ConfigError(str(error)) from None


def add_network_arguments(parser) -> None:
    """`--link` and `--ranks-per-host` for the sub-commands that take them as plain options (allreduce, train)."""
    parser.add_argument("--link", default="none", metavar="LIST",
                        help="comma-separated: none (loopback, default) or link rates such as 500mbit,1gbit,10gbit: "
                             "ranks on emulated hosts behind links of that rate (needs root; see ddpbench network)")
    parser.add_argument("--ranks-per-host", default="1", metavar="LIST",
                        help="comma-separated: ranks per emulated host, placed in rank order (default 1)")


def parse_network_arguments(args) -> list[tuple[str, int]]:
    """The validated (link, ranks per host) pairs of `--link` x `--ranks-per-host`."""
    pairs = [(link.strip().lower(), k) for link in args.link.split(",")
             for k in parse_ints("ranks-per-host", args.ranks_per_host, minimum=1)]
    for link, k in pairs:
        validate_network(link, k)
    return pairs


def check_network_available(jobs: list) -> None:
    """Refuse, before any process starts, jobs with a link where this machine cannot emulate one."""
    links = sorted({job.link for job in jobs if job.link != "none"})
    if not links:
        return
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        raise ConfigError(f"--link={','.join(links)}: under torchrun the hosts are real; use --link none")
    problems = network.check()
    if problems:
        raise ConfigError(f"--link={','.join(links)} needs an emulated network, which this machine cannot make: "
                          f"{'; '.join(problems)}. --link none (loopback) works without it; "
                          "`ddpbench network --check` says more")


def validate_backend(backend: str, device: str, world_size: int, gpu_count: int | None = None) -> None:
    """Raise ConfigError unless `backend` can reduce `device` tensors over `world_size` local ranks here."""
    _one_of("backend", backend, BACKENDS)
    _one_of("device", device, DEVICES)
    if backend == "nccl" and device != "cuda":
        raise ConfigError(f"--backend nccl needs --device cuda (NCCL reduces only GPU tensors), got --device {device}")
    if backend == "mpi":
        import torch.distributed as dist

        if not dist.is_mpi_available():
            raise ConfigError("--backend mpi is not available: this torch build has no MPI support; use gloo or nccl")
    if device == "cuda":
        if gpu_count is None:
            import torch

            gpu_count = torch.cuda.device_count()
        if gpu_count == 0:
            raise ConfigError("--device cuda needs a CUDA GPU, and none is visible; use --device cpu")
        # Under torchrun the ranks may span machines: the local GPU count does not bound the world size.
        if backend == "nccl" and world_size > gpu_count and "WORLD_SIZE" not in os.environ:
            raise ConfigError(
                f"--world-size={world_size} exceeds the {gpu_count} GPU(s) here; NCCL needs one GPU per rank"
            )


def parse_ints(flag: str, text: str, minimum: int) -> list[int]:
    """Parse a comma-separated list of integers, each at least `minimum`, naming the flag on error."""
    values = []
    for item in text.split(","):
        try:
            number = float(item)  # accepts 60000000 and 6e7 alike
            if not number.is_integer():
                raise ValueError
            value = int(number)
        except ValueError:
            raise ConfigError(f"--{flag}: {item.strip()!r} is not an integer") from None
        if value < minimum:
            raise ConfigError(f"--{flag}={value} is not allowed; it must be >= {minimum}")
        values.append(value)
    return values


def default_backend_and_device() -> tuple[str, str]:
    """NCCL on CUDA where GPUs exist, else Gloo on the CPU."""
    import torch

    return ("nccl", "cuda") if torch.cuda.is_available() else ("gloo", "cpu")


def _one_of(name: str, value: str, allowed) -> None:
    if value not in allowed:
        raise ConfigError(f"--{name}={value!r} is not allowed; choose one of {', '.join(allowed)}")


def _flag(name: str) -> str:
    return name.replace("_", "-")
