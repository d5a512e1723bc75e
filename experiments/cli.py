"""`ddpbench` (also `python -m experiments`): run, allreduce, train, compare, ab, profile, predict, tune-bucket, advise.

Every input is checked before any process starts; a bad one exits with status 2, names the
parameter, the value and what is allowed, and writes nothing.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import sys
import tempfile
from pathlib import Path

from ddp_core.hooks import HOOKS

from .config import (BACKENDS, COMPUTE, DEVICES, IMPLS, LIST_PARAMS, ConfigError, RunConfig, check_network_available,
                     default_backend_and_device, expand_grid, parse_list)
from .workloads import WORKLOADS
from .workloads.spec import MODEL_HELP

EXIT_BAD_INPUT = 2


# The allowed values of the `run` lists that take names, shown in --help.
ALLOWED = {"model": [*sorted(WORKLOADS), MODEL_HELP], "amp": ["none", "bf16", "fp16 (CUDA)"], "impl": list(IMPLS),
           "comm_hook": ["none", *HOOKS], "backend": list(BACKENDS), "device": list(DEVICES), "compute": list(COMPUTE)}
DEFAULT_BY_HARDWARE = {"backend": "nccl with GPUs, else gloo", "device": "cuda with GPUs, else cpu",
                       "threads": "the cores shared among the ranks"}


def _add_list_params(parser: argparse.ArgumentParser, names: list[str]) -> None:
    defaults = RunConfig()
    for name in names:
        allowed = f" of {', '.join(ALLOWED[name])}" if name in ALLOWED else ""
        if name == "link":
            allowed = " of none (loopback) or link rates such as 1gbit (emulated hosts; needs root)"
        if name == "model_config":
            allowed = (" key=value pairs for --model (configuration fields of transformers:, builder keywords of "
                       "torchvision: and of a user file's build_model); several configurations separated by ';'")
        default = DEFAULT_BY_HARDWARE.get(name, repr(getattr(defaults, name)))
        parser.add_argument(f"--{name.replace('_', '-')}", dest=name, metavar="LIST",
                            help=f"comma-separated{allowed}; default {default}")


def build_parser() -> argparse.ArgumentParser:
    """The command line: one sub-command per kind of measurement."""
    parser = argparse.ArgumentParser(prog="ddpbench", description="DDP benchmarks after Li et al., VLDB 2020")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="measure training iterations over a grid of configs")
    _add_list_params(run, list(LIST_PARAMS))
    _add_common(run)
    run.add_argument("--trace", type=Path, metavar="DIR", help="write a Chrome/Perfetto trace per config here")

    from . import allreduce, train  # small modules; imported here to keep one parser in one place
    from .regression import ab, compare

    allreduce.add_arguments(sub.add_parser("allreduce", help="all-reduce microbenchmarks (E1 and a size sweep)"))
    train.add_arguments(sub.add_parser("train", help="training loss per iteration for sync-every n (E6)"))
    from .perfmodel import commands as perfmodel

    perfmodel.add_profile_arguments(sub.add_parser("profile", help="one-process profile for the performance model"))
    for name in ("allreduce", "train", "profile"):
        _add_common(sub.choices[name])
    perfmodel.add_model_arguments(sub.add_parser("predict", help="predict DDP latency from a profile (model)"), False)
    perfmodel.add_model_arguments(sub.add_parser("tune-bucket", help="recommend a bucket cap (model)"), True)
    perfmodel.add_scale_arguments(sub.add_parser("scale-profile", help="a profile scaled to a GPU's estimated time"))
    from .perfmodel import advise

    advise.add_arguments(sub.add_parser("advise", help="how DDP will behave for your model: profile, predict, advise"))
    compare.add_arguments(sub.add_parser("compare", help="did latency change between two sets of records?"))
    ab.add_arguments(sub.add_parser("ab", help="A/B two git revisions on this machine, interleaved"))
    from .regression import drill, history

    history.add_arguments(sub.add_parser("history", help="latency per commit, recorded and plotted"))
    drill.add_arguments(sub.add_parser("drill", help="inject regressions, measure their true size, A/B them"))
    from . import network

    network.add_arguments(sub.add_parser("network", help="can this machine emulate a cluster (--link)? clean up"))
    parser.set_defaults(subcommands=sub.choices)  # main() reports a sub-command's unknown options with its usage
    return parser


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, required=True, help="JSON-lines record file (appended to)")
    parser.add_argument("--resume", action="store_true", help="skip configs already recorded in --out")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds one config may take (default 600)")


def resolve_run_configs(args: argparse.Namespace) -> list[RunConfig]:
    """Expand the `run` lists into validated configs, filling hardware-dependent defaults."""
    lists = {name: parse_list(name, getattr(args, name)) for name in LIST_PARAMS if getattr(args, name) is not None}
    backend, device = default_backend_and_device()
    lists.setdefault("backend", [backend])
    lists.setdefault("device", [device])
    threads_given = "threads" in lists
    configs = expand_grid(lists)
    if not threads_given:
        # Default: share the cores among the ranks of this machine.
        local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", 0))
        configs = [dataclasses.replace(c, threads=max(1, (os.cpu_count() or 1) // (local_ranks or c.world_size)))
                   for c in configs]
    return configs


def check_output(path: Path, flag: str = "out") -> None:
    """Refuse an output file we could not append to, before anything runs (nothing is written)."""
    if path.exists():
        try:  # opening for appending writes nothing, and is the only answer root and /proc do not fool
            os.close(os.open(path, os.O_WRONLY | os.O_APPEND))
        except OSError as error:
            raise ConfigError(f"--{flag}={str(path)!r} is not a writable file ({error.strerror})") from None
        if path.is_dir():
            raise ConfigError(f"--{flag}={str(path)!r} is a folder, not a file")
        return
    _check_creatable(path, flag)


def check_folder(path: Path, flag: str) -> None:
    """Refuse an output folder we could not write files into, before anything runs (nothing is left behind)."""
    if path.exists():
        if not path.is_dir():
            raise ConfigError(f"--{flag}={str(path)!r} is not a folder")
        _try_writing_in(path, path, flag)
        return
    _check_creatable(path, flag)


def _check_creatable(path: Path, flag: str) -> None:
    ancestor = path.parent.absolute()
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ConfigError(f"--{flag}={str(path)!r}: cannot create it, {str(ancestor)!r} is a file")
    _try_writing_in(ancestor, path, flag)


def _try_writing_in(folder: Path, path: Path, flag: str) -> None:
    # Permission bits say nothing for root, and /proc or a read-only mount refuse only an actual
    # attempt: create a temporary file there, which is removed at once.
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as error:
        raise ConfigError(f"--{flag}={str(path)!r}: cannot create it under {str(folder)!r} "
                          f"({error.strerror or error})") from None


def check_positive(name: str, value: float) -> None:
    """Raise ConfigError unless `value` > 0."""
    if not value > 0:
        raise ConfigError(f"--{name}={value} is not allowed; it must be > 0")


def _terminate(signum, frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit status (0 ok, 1 some config failed, 2 bad input, 130 Ctrl-C)."""
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # argparse would print the top-level usage; the sub-command's says what it takes
        args.subcommands[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")
    # A polite kill (SIGTERM) unwinds like Ctrl-C, so ranks and emulated networks are removed on the way out.
    signal.signal(signal.SIGTERM, _terminate)
    from . import allreduce, train
    from .perfmodel import commands as perfmodel
    from .sweep import run_sweep

    if args.command in ("predict", "tune-bucket"):
        return perfmodel.main(args)
    if args.command == "advise":
        from .perfmodel import advise

        return advise.main(args)
    if args.command == "scale-profile":
        return perfmodel.scale_main(args)
    if args.command in ("compare", "ab", "history", "drill"):
        from .regression import ab, compare, drill, history

        return {"compare": compare, "ab": ab, "history": history, "drill": drill}[args.command].main(args)
    if args.command == "network":
        from . import network

        return network.main(args)
    try:
        check_positive("timeout", args.timeout)
        check_output(args.out)
        if getattr(args, "trace", None) is not None:
            check_folder(args.trace, "trace")
        mode = {"allreduce": allreduce, "train": train, "profile": perfmodel}.get(args.command)
        jobs = resolve_run_configs(args) if mode is None else mode.resolve(args)
        check_network_available(jobs)
    except ConfigError as error:
        print(f"ddpbench {args.command}: error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    args.out.parent.mkdir(parents=True, exist_ok=True)
    size_before = args.out.stat().st_size if args.out.exists() else 0
    try:
        if mode is None:
            counts = run_sweep(jobs, args.out, resume=args.resume, timeout=args.timeout, trace_dir=args.trace)
        else:
            counts = mode.run(jobs, args)
    except KeyboardInterrupt:
        if args.out.exists() and args.out.stat().st_size > size_before:
            print(f"\nddpbench: interrupted; finished configs are in {args.out}; add --resume to continue",
                  file=sys.stderr)
        else:
            print(f"\nddpbench: interrupted before any config finished; nothing was added to {args.out}",
                  file=sys.stderr)
        return 130
    print(f"ddpbench {args.command}: {counts['ok']} ok, {counts['failed']} failed, {counts['skipped']} skipped "
          f"(already recorded); records in {args.out}")
    return 1 if counts["failed"] else 0
