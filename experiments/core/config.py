"""One typed config per measured run, the parsing of its lists, and the checks of its values.

Validation happens here, before any process starts: each error names the parameter, the value and
what is allowed.
"""
from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, fields

IMPLS = ("ddp_core", "ddp_core_no_overlap", "torch")
COMPUTE = ("real", "emulated")
BACKENDS = ("nccl", "gloo", "mpi")
DEVICES = ("cpu", "cuda")
AMPS = ("none", "bf16", "fp16")
_UNITS = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}  # tc's units of a link rate


class ConfigError(ValueError):
    """An invalid parameter value; the message names the parameter, the value and what is allowed."""


@dataclass(frozen=True)
class RunConfig:
    """Everything that defines one measured configuration; stored, resolved, next to its results."""

    model: str = "resnet-tiny"
    backend: str = "gloo"
    device: str = "cpu"
    world_size: int = 2
    bucket_mb: float | str = 25.0  # MB, or "auto": ddp_core chooses the cap while it trains (ddp_core.auto_bucket)
    sync_every: int = 1
    # PyTorch's DDP by default: what users train with; ddp_core (the paper's system rebuilt) where named
    impl: str = "torch"
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
    # --- DDP's own options, for both implementations ---
    find_unused_parameters: bool = False  # search the autograd graph for parameters that get no gradient
    static_graph: bool = False  # the same parameters get gradients in the same order every iteration
    bucket_view: bool = False  # gradient_as_bucket_view: gradients are views into the buckets (no copy)
    compile: str = "none"  # torch.compile of the DDP-wrapped model: none or a mode (default, max-autotune, ...)
    powersgd_rank: int = 1  # with --comm-hook powersgd: the rank of PowerSGD's low-rank approximation


# Parameters the CLI accepts as comma-separated lists, with their element types (model_hash: derived).
LIST_PARAMS = {f.name: f.type for f in fields(RunConfig) if f.name != "model_hash"}
def _boolean(text: str) -> bool:
    if text.lower() not in ("true", "false"):
        raise ValueError(text)
    return text.lower() == "true"


_boolean.__name__ = "boolean (true or false)"


def _cap(text: str) -> float | str:
    return "auto" if text.lower() == "auto" else float(text)


_cap.__name__ = "bucket cap (a number of MB, or auto)"
AUTO_CAP = "auto"
# (a field's type as its annotation reads: `from __future__ import annotations` keeps annotations as text)
_TYPES = {"str": str, "int": int, "float": float, "bool": _boolean, "float | str": _cap}
# torch.compile's modes (`default` is its default mode); `none` runs the model as it is.
COMPILE_MODES = ("none", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
# The names of ddp_core.hooks.HOOKS, spelled out so that checking --comm-hook and showing it in --help
# import no torch (tests/unit/test_cli_start_up.py checks that the two agree).
HOOK_NAMES = ("allreduce", "fp16", "bf16")
# Hooks of PyTorch's that the harness registers with a state of their own (ddp_core's hooks: ddp_core.hooks).
TORCH_HOOKS = ("powersgd",)


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
        if kind in (float, _cap) and isinstance(values[-1], float) and not math.isfinite(values[-1]):  # float() takes nan and inf; no size or factor may be
            raise ConfigError(f"--{_flag(name)}: {item!r} is not allowed; it must be a finite number")
    if name == "model_config":
        return values  # "" is allowed: the defaults
    if not values or any(v == "" for v in values):
        raise ConfigError(f"--{_flag(name)}: {text!r} holds an empty value")
    return values


def check_config(config: RunConfig, gpu_count: int | None = None) -> None:
    """Raise ConfigError for the first invalid value of `config`, its model aside (measure.configs checks
    that the model can be built and fits in memory)."""
    # Configs also arrive as data (plans, presets), not only through parse_list: nan passes every `<`
    # check below, and either would end as a record that JSON cannot hold.
    for field in fields(config):
        value = getattr(config, field.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"--{_flag(field.name)}={value} is not allowed; it must be a finite number")
    _one_of("amp", config.amp, AMPS)
    if config.amp == "fp16" and config.device != "cuda":
        raise ConfigError("--amp fp16 needs --device cuda: float16 training needs a gradient scaler, which "
                          "ddpbench uses on GPUs only, and CPUs compute float16 slowly; use --amp bf16 on the CPU")
    _one_of("impl", config.impl, IMPLS)
    _one_of("comm-hook", config.comm_hook, ["none", *HOOK_NAMES, *TORCH_HOOKS])
    for name, minimum in (("world_size", 1), ("sync_every", 1), ("process_groups", 1), ("batch_size", 1),
                          ("image_size", 8), ("seq_len", 2), ("iters", 1), ("warmup", 0), ("threads", 1)):
        value = getattr(config, name)
        if value < minimum:
            raise ConfigError(f"--{_flag(name)}={value} is not allowed; it must be >= {minimum}")
    if config.iters % config.sync_every:
        raise ConfigError(f"--iters={config.iters} must be a multiple of --sync-every={config.sync_every}, so that "
                          "every measured window holds whole cycles of skipped and synchronised iterations")
    check_bucket_cap(config)
    validate_network(config.link, config.ranks_per_host, config.world_size)
    validate_compute(config)
    if config.impl == "torch" and (config.process_groups > 1):
        raise ConfigError("--process-groups > 1 needs --impl ddp_core or ddp_core_no_overlap (PyTorch's DDP takes one group)")
    check_ddp_options(config)
    validate_backend(config.backend, config.device, config.world_size, gpu_count)


def check_bucket_cap(config: RunConfig) -> None:
    """Raise ConfigError unless --bucket-mb is a number >= 0 or `auto` with an implementation and options
    that can choose their cap while training."""
    cap = config.bucket_mb
    if isinstance(cap, str):
        if cap != AUTO_CAP:
            raise ConfigError(f"--bucket-mb={cap!r} is not allowed; it must be a number of MB >= 0 or auto")
        if config.impl == "torch":
            raise ConfigError("--bucket-mb auto needs --impl ddp_core or ddp_core_no_overlap: PyTorch's DDP has no "
                              "bucket tuner (ddp_core chooses its cap in its first synchronised iterations)")
        if config.comm_hook == "powersgd":
            raise ConfigError("--bucket-mb auto cannot go with --comm-hook powersgd: PowerSGD keeps its error "
                              "feedback per bucket, and auto re-buckets while it tries layouts")
        if config.compile != "none":
            raise ConfigError(f"--bucket-mb auto needs --compile none: auto re-buckets during training, which a "
                              f"compiled graph ({config.compile}) would not see")
    elif isinstance(cap, bool) or cap < 0:
        raise ConfigError(f"--bucket-mb={cap} is not allowed; it must be >= 0 (0 = one parameter per bucket) or auto")


def cap_text(cap: float | str) -> str:
    """A bucket cap as a record's reader sees it: `25`, `0.5`, `auto`."""
    return cap if isinstance(cap, str) else f"{cap:g}"


def check_ddp_options(config: RunConfig) -> None:
    """Raise ConfigError for a combination of DDP options that an implementation cannot run, saying why."""
    _one_of("compile", config.compile, COMPILE_MODES)
    if config.powersgd_rank < 1:
        raise ConfigError(f"--powersgd-rank={config.powersgd_rank} is not allowed; it must be >= 1")
    if config.comm_hook == "powersgd" and config.process_groups > 1:
        raise ConfigError("--comm-hook powersgd needs --process-groups 1: PowerSGD's state holds one process group "
                          "and its error feedback per bucket, which round-robin groups would share")
    if config.compile != "none" and config.compute == "emulated":
        raise ConfigError(f"--compile {config.compile} needs --compute real: a stand-in only waits, there is nothing "
                          "to compile")


def parse_rate(text: str) -> float:
    """Bits per second of a link rate such as `500mbit`, `2.5gbit` or `10gbit` (tc's units)."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(kbit|mbit|gbit)", text.strip().lower())
    if not match or float(match.group(1)) <= 0:
        raise ValueError(f"{text!r} is not a link rate; write a number and kbit, mbit or gbit, e.g. 500mbit, "
                         "2.5gbit, or none for loopback")
    return float(match.group(1)) * _UNITS[match.group(2)]


def to_argv(options: dict) -> list[str]:
    """The `ddpbench` arguments of typed options (the one place data becomes command-line text, for a
    run in another process or another revision's tree): a list is comma-joined (model configurations
    with ';'), a float written as %g, True as a bare flag, False and None left out."""
    argv = []
    for name, value in options.items():
        flag = f"--{_flag(name)}"
        if value is True:
            argv.append(flag)
            continue
        if value is False or value is None:
            continue
        values = value if isinstance(value, (list, tuple)) else [value]
        text = [f"{v:g}" if isinstance(v, float) else str(v) for v in values]
        argv += [flag, (";" if name == "model_config" else ",").join(text)]
    return argv


def validate_network(link: str, ranks_per_host: int, world_size: int | None = None) -> None:
    """Raise ConfigError unless `link` is `none` or a rate, and `ranks_per_host` fits it (and `world_size`)."""
    if link != "none":
        try:
            parse_rate(link)
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
    from experiments.core.profile import ComputeProfileError, load_compute_profile

    try:
        load_compute_profile(config.compute_profile, config.model, config.world_size)
    except ComputeProfileError as error:
        raise ConfigError(str(error)) from None


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


def parse_ints(flag: str, text: str | list[int], minimum: int) -> list[int]:
    """Parse a comma-separated list of integers (or check a list of them, given as data), each at least
    `minimum`, naming the flag on error."""
    values = []
    for item in text.split(",") if isinstance(text, str) else text:
        try:
            number = float(item)  # accepts 60000000 and 6e7 alike
            if not number.is_integer():
                raise ValueError
            value = int(number)
        except ValueError:
            raise ConfigError(f"--{flag}: {str(item).strip()!r} is not an integer") from None
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
