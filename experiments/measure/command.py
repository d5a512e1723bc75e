"""The measuring sub-commands' one path (run, allreduce, train, profile): check the options and the jobs
before any process starts, measure, say what was recorded, and exit 130 on Ctrl-C; and `run`'s options."""
from __future__ import annotations

import os
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from experiments.args import EXIT_BAD_INPUT, EXIT_INTERRUPTED, check_folder, check_output, check_timeout
from experiments.core.config import ConfigError, RunConfig
from experiments.measure.configs import (
    SameOnEveryRank,
    check_network_available,
    check_torchrun_job,
    grid_values,
    resolve_grid,
)


@dataclass(frozen=True)
class RunOptions:
    """What `ddpbench run` measures and where its records go: `grid` maps RunConfig fields to their values,
    comma-separated text or the values themselves (each list one axis of the grid; what it leaves out, the
    defaults and the hardware's fill in)."""

    out: Path
    grid: dict[str, str | list] = field(default_factory=dict)
    resume: bool = False
    timeout: float = 600.0
    trace: Path | None = None
    dry_run: bool = False


def rank() -> int:
    """This process's rank under torchrun (RANK), else 0: the built-in launcher's parent speaks for its ranks."""
    from experiments.core.machine import under_torchrun

    return int(os.environ["RANK"]) if under_torchrun() else 0


def run_configs(options: RunOptions) -> list[RunConfig]:
    """The grid expanded into validated configs with the hardware's defaults (ConfigError naming a bad value)."""
    return resolve_grid({name: grid_values(name, values) for name, values in options.grid.items()})


def run(options: RunOptions) -> int:
    """`ddpbench run`: measure every config of the grid not yet recorded (see measure_jobs)."""
    def measure_all(configs: list) -> dict:
        from experiments.measure import sweep  # imports torch; looked up here, so that a test may replace it

        return sweep.run_sweep(configs, options.out, resume=options.resume, timeout=options.timeout,
                               trace_dir=options.trace)

    return measure_jobs("run", options.out, options.resume, options.timeout, lambda: run_configs(options),
                        measure_all, torchrun_job=True, trace=options.trace, dry_run=options.dry_run)


def measure_jobs(command: str, out: Path, resume: bool, timeout: float, resolve: Callable[[], list],
                 measure: Callable[[list], dict], torchrun_job: bool = False, trace: Path | None = None,
                 dry_run: bool = False) -> int:
    """Check the options, resolve the jobs, measure them into `out`; the exit status (0 ok, 1 some job
    failed, 2 bad input, 130 Ctrl-C). `measure(jobs)` returns the counts of ok, failed and skipped jobs."""
    try:
        check_timeout("timeout", timeout)
        check_output(out)
        if trace is not None:
            check_folder(trace, "trace")
        jobs = resolve()
        check_network_available(jobs)
        if torchrun_job:
            check_torchrun_job(jobs)
    except ConfigError as error:
        # Under torchrun every rank runs this: what all find alike, rank 0 alone says (one line, not one per rank).
        if not isinstance(error, SameOnEveryRank) or rank() == 0:
            print(f"ddpbench {command}: error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if dry_run:
        from experiments.measure.dryrun import plan

        for line in plan(jobs, out, resume):
            print(line)
        return 0
    out.parent.mkdir(parents=True, exist_ok=True)
    size_before = out.stat().st_size if out.exists() else 0
    try:
        counts = measure(jobs)
    except KeyboardInterrupt:
        # Stopping: more Ctrl-C (a user pressing it again) must not break the exit half-way (atexit
        # handlers, the message below) - the ranks and networks are already gone.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if out.exists() and out.stat().st_size > size_before:
            print(f"\nddpbench: interrupted; finished configs are in {out}; add --resume to continue", file=sys.stderr)
        else:
            print(f"\nddpbench: interrupted before any config finished; nothing was added to {out}", file=sys.stderr)
        return EXIT_INTERRUPTED
    if rank() == 0:  # under torchrun, rank 0 writes the records: the other ranks claim none
        print(f"ddpbench {command}: {counts['ok']} ok, {counts['failed']} failed, {counts['skipped']} skipped "
              f"(already recorded); records in {out}")
    return 1 if counts["failed"] else 0
