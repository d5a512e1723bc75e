"""`ddpbench drift`: how far one config's median latency moves between separate launches on this machine.

The iterations of one launch share its memory placement, page faults, thread placement and the other
load of its minutes; a second launch of identical code draws all of these again. So the spread between
the iterations of one launch says nothing of how far two launches stray, and `compare` of one launch
against one launch needs the machine's launch-to-launch drift, measured apart: this command.

Each launch is a fresh `ddpbench run` process (its own ranks) of the same config, back to back. Its
record, tagged `"drift": {"session": ..., "launch": i}`, is appended to the machine's drift file
(results/runs/<machine>/drift.jsonl) as soon as it ends, so an interrupted measurement keeps what it
finished and a second session adds to the first. The drift is the standard deviation of the launches'
log medians about their session's mean, pooled over sessions (launches - sessions degrees of freedom);
measure it under the load the compared runs meet (a shared CI runner: while it is shared).

    ./ddpbench drift                           # 10 launches of resnet-tiny at 2 ranks, 30 iterations
    ./ddpbench drift --launches 10 --model bert-tiny
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from experiments.core.config import ConfigError
from experiments.core.drift import drift_file, pooled_drift, stored_drift
from experiments.core.machine import this_machine
from experiments.core.records import append_record, read_records

ROOT = Path(__file__).resolve().parents[2]
MIN_LAUNCHES = 3  # fewer say next to nothing of a spread (1 degree of freedom)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `drift` sub-command's options."""
    parser.add_argument("--model", default="resnet-tiny", help="the model launched again and again (default resnet-tiny)")
    parser.add_argument("--world-size", type=int, default=2, help="ranks per launch (default 2)")
    parser.add_argument("--iters", type=int, default=30, help="measured iterations per launch (default 30)")
    parser.add_argument("--warmup", type=int, default=3, help="warm-up iterations per launch (default 3)")
    parser.add_argument("--launches", type=int, default=10, help=f"launches in this session (default 10, at least "
                                                                 f"{MIN_LAUNCHES})")
    parser.add_argument("--out", type=Path, help="drift file appended to (default results/runs/<machine>/drift.jsonl, "
                                                 "where compare looks for it)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds one launch may take (default 600)")


@dataclass(frozen=True)
class DriftOptions:
    """What `ddpbench drift` launches again and again, and where its launches go (its flags, typed)."""

    model: str = "resnet-tiny"
    world_size: int = 2
    iters: int = 30
    warmup: int = 3
    launches: int = 10
    out: Path | None = None
    timeout: float = 600.0


def launch_command(options: DriftOptions, out: Path) -> list[str]:
    """One launch: `ddpbench run` of the config, in a process of its own."""
    return [sys.executable, "-m", "experiments", "run", "--model", options.model,
            "--world-size", str(options.world_size),
            "--iters", str(options.iters), "--warmup", str(options.warmup), "--out", str(out),
            "--timeout", str(options.timeout)]


def check(options: DriftOptions) -> Path:
    """The drift file to append to; ConfigError naming the first bad option (before anything runs)."""
    from experiments.args import check_output, check_timeout
    from experiments.measure.configs import resolve_grid

    if options.launches < MIN_LAUNCHES:
        raise ConfigError(f"--launches={options.launches} is not allowed; it must be >= {MIN_LAUNCHES}")
    resolve_grid({"model": [options.model], "world_size": [options.world_size], "iters": [options.iters],
                  "warmup": [options.warmup]})
    check_timeout("timeout", options.timeout)
    out = options.out or drift_file()
    check_output(out)
    return out


def main(options: DriftOptions) -> int:
    """Launch the config `--launches` times, appending each launch's record; 2 on bad input, 1 if a launch fails."""
    try:
        out = check(options)
    except ConfigError as error:
        print(f"ddpbench drift: error: {error}", file=sys.stderr)
        return 2
    out.parent.mkdir(parents=True, exist_ok=True)
    session = time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + f"-{os.getpid()}"
    medians = []
    with tempfile.TemporaryDirectory(prefix="ddpbench-drift-") as scratch:
        for launch in range(options.launches):
            single = Path(scratch) / f"launch-{launch}.jsonl"
            done = subprocess.run(launch_command(options, single), cwd=ROOT, capture_output=True, text=True,
                                  env={**os.environ, "PYTHONPATH": str(ROOT)})
            records = [r for r in read_records(single) if r.get("kind") == "run"] if single.exists() else []
            if done.returncode != 0 or len(records) != 1 or records[0].get("status") != "ok":
                print(f"ddpbench drift: launch {launch + 1} failed (exit {done.returncode}); the launches before "
                      f"it are kept in {out}:\n{done.stderr[-2000:]}", file=sys.stderr)
                return 1
            record = {**records[0], "drift": {"session": session, "launch": launch}}
            append_record(out, record)
            medians.append(float(np.median(record["latency_s"])))
            print(f"drift: launch {launch + 1}/{options.launches}: median {medians[-1] * 1e3:.2f} ms", flush=True)
    this = pooled_drift({session: medians})
    total = stored_drift(out, this_machine()["id"])
    print(f"drift: this session's launches stray by {this['sd']:.1%} (sd of log medians, {this['launches']} "
          f"launches); {out} holds {total['sd']:.1%} over {total['launches']} launches in {total['sessions']} "
          "session(s), which compare uses for configs with one launch on a side")
    return 0
