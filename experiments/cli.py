"""`ddpbench` (also `python -m experiments`): run, allreduce, train, compare, ab, profile, predict, tune-bucket.

Every input is checked before any process starts; a bad one exits with status 2, names the
parameter, the value and what is allowed, and writes nothing.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import sys
from pathlib import Path

from .config import (LIST_PARAMS, ConfigError, RunConfig, check_network_available, default_backend_and_device,
                     expand_grid, parse_list)

EXIT_BAD_INPUT = 2


def _add_list_params(parser: argparse.ArgumentParser, names: list[str]) -> None:
    defaults = RunConfig()
    for name in names:
        parser.add_argument(f"--{name.replace('_', '-')}", dest=name, metavar="LIST",
                            help=f"comma-separated; default {getattr(defaults, name)!r}")


def build_parser() -> argparse.ArgumentParser:
    """The command line: one sub-command per kind of measurement."""
    parser = argparse.ArgumentParser(prog="ddpbench", description="DDP benchmarks after Li et al., VLDB 2020")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="measure training iterations over a grid of configs")
    _add_list_params(run, list(LIST_PARAMS))
    _add_common(run)
    run.add_argument("--trace", type=Path, metavar="DIR", help="write a Chrome/Perfetto trace per config here")

    from . import ab, allreduce, compare, train  # small modules; imported here to keep one parser in one place

    allreduce.add_arguments(sub.add_parser("allreduce", help="all-reduce microbenchmarks (E1 and a size sweep)"))
    train.add_arguments(sub.add_parser("train", help="training loss per iteration for sync-every n (E6)"))
    from .perfmodel import commands as perfmodel

    perfmodel.add_profile_arguments(sub.add_parser("profile", help="one-process profile for the performance model"))
    for name in ("allreduce", "train", "profile"):
        _add_common(sub.choices[name])
    perfmodel.add_model_arguments(sub.add_parser("predict", help="predict DDP latency from a profile (model)"), False)
    perfmodel.add_model_arguments(sub.add_parser("tune-bucket", help="recommend a bucket cap (model)"), True)
    compare.add_arguments(sub.add_parser("compare", help="did latency change between two sets of records?"))
    ab.add_arguments(sub.add_parser("ab", help="A/B two git revisions on this machine, interleaved"))
    from . import history

    history.add_arguments(sub.add_parser("history", help="latency per commit, recorded and plotted"))
    from . import network

    network.add_arguments(sub.add_parser("network", help="can this machine emulate a cluster (--link)? clean up"))
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


def check_output(path: Path) -> None:
    """Refuse an output we could not append to, before anything runs."""
    if path.exists():
        if path.is_dir() or not os.access(path, os.W_OK):
            raise ConfigError(f"--out={str(path)!r} is not a writable file")
        return
    ancestor = path.parent.resolve()
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir() or not os.access(ancestor, os.W_OK):
        raise ConfigError(f"--out={str(path)!r}: cannot create it under {str(ancestor)!r} (not writable)")


def check_positive(name: str, value: float) -> None:
    """Raise ConfigError unless `value` > 0."""
    if not value > 0:
        raise ConfigError(f"--{name}={value} is not allowed; it must be > 0")


def _terminate(signum, frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit status (0 ok, 1 some config failed, 2 bad input, 130 Ctrl-C)."""
    args = build_parser().parse_args(argv)
    # A polite kill (SIGTERM) unwinds like Ctrl-C, so ranks and emulated networks are removed on the way out.
    signal.signal(signal.SIGTERM, _terminate)
    from . import ab, allreduce, compare, train
    from .perfmodel import commands as perfmodel
    from .sweep import run_sweep

    if args.command in ("predict", "tune-bucket"):
        return perfmodel.main(args)
    if args.command == "history":
        from . import history

        return history.main(args)
    if args.command in ("compare", "ab"):
        return (compare if args.command == "compare" else ab).main(args)
    if args.command == "network":
        from . import network

        return network.main(args)
    try:
        check_positive("timeout", args.timeout)
        check_output(args.out)
        mode = {"allreduce": allreduce, "train": train, "profile": perfmodel}.get(args.command)
        jobs = resolve_run_configs(args) if mode is None else mode.resolve(args)
        check_network_available(jobs)
    except ConfigError as error:
        print(f"ddpbench {args.command}: error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    args.out.parent.mkdir(parents=True, exist_ok=True)
    try:
        if mode is None:
            counts = run_sweep(jobs, args.out, resume=args.resume, timeout=args.timeout, trace_dir=args.trace)
        else:
            counts = mode.run(jobs, args)
    except KeyboardInterrupt:
        print(f"\nddpbench: interrupted; finished configs are in {args.out}; add --resume to continue",
              file=sys.stderr)
        return 130
    print(f"ddpbench {args.command}: {counts['ok']} ok, {counts['failed']} failed, {counts['skipped']} skipped "
          f"(already recorded); records in {args.out}")
    return 1 if counts["failed"] else 0
