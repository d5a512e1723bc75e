"""`ddpbench ab BASE_REV [HEAD_REV]`: A/B two commits on this machine, in one job.

Both revisions are checked out in temporary git worktrees that share the installed environment. Two
designs, so that drift of a shared, noisy machine hits both revisions alike:
- `--interleave iterations` (default; interleaved.py): both revisions' ddp_core in one set of
  processes per config, taking turns iteration by iteration; each block of turns is a round;
- `--interleave processes`: the preset runs on each revision in fresh processes, alternating A B,
  B A, ... over several rounds; measures changes outside ddp_core too, far noisier.
Every record is tagged with its round, so that compare pairs BASE and NEW round by round (see
compare.py and stats.paired_ratio). Exit status: 1 if HEAD is significantly slower than BASE by more than the
threshold on any config, 0 otherwise, 2 on bad input or when a revision cannot run the preset.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from experiments.core.config import ConfigError, to_argv
from experiments.core.git import add_worktree, git, prune_worktrees, remove_worktree, resolve_commit
from experiments.core.machine import QUIET_CORES, cpu_seconds, other_cores_busy
from experiments.core.records import RecordError, SchemaError, append_record, config_key, read_records
from experiments.emulate import network
from experiments.regression import interleaved
from experiments.regression.compare import MIN_PAIRED_ROUNDS, check_verdict_options, compare, format_table

# preset -> its grid of `run` parameters (typed values, as expand_grid takes them), the default number of A/B rounds in fresh
# processes, and the measured seconds per config of an interleaved A/B with its replicas of the model
# per revision (see interleaved.py; the paper's models: one, for memory). The grids name ddp_core: the gate
# measures this project's DDP, which a commit can change (PyTorch's DDP is the same in both trees).
PRESETS = {
    # tiny models: the whole A/B ends within 5 minutes on 2 cores. Sequence length 64, not 16: run alone,
    # bert-tiny's median moved by up to 30% from one process to the next at 16, by 1% at 64 (after
    # resnet-tiny in the same processes it still moves by 10-25%; see docs/drill.md).
    "smoke": {"replicas": 3, "rounds": 8, "seconds": 20,
              "grid": {"impl": ["ddp_core"],
                       "model": ["resnet-tiny", "bert-tiny"], "world_size": [2], "image_size": [16], "seq_len": [64],
                       "batch_size": [4], "iters": [30], "warmup": [5], "threads": [1]}},
    # one tiny model and few iterations: for tests and for trying the tools, too short to trust
    "quick": {"replicas": 3, "rounds": 3, "seconds": 3,
              "grid": {"impl": ["ddp_core"],
                       "model": ["bert-tiny"], "world_size": [2], "seq_len": [16], "batch_size": [4], "iters": [10],
                       "warmup": [2], "threads": [1]}},
    # resnet-tiny on 2 emulated hosts behind a 2.5 Gbit/s link, where communication is about half of the
    # iteration without overlap: the regressions that only show where communication matters (overlap lost,
    # smaller buckets). 5 MB buckets, so that its 18.7 MB of gradients fill several buckets and overlap
    # with backward (measured: 105 ms, 122 ms without overlap); at 25 MB they all wait in one bucket for
    # the end of backward, and there is no overlap to lose. Needs root (`ddpbench network --check`).
    "link": {"replicas": 3, "rounds": 6, "seconds": 30,
              "grid": {"impl": ["ddp_core"],
                       "model": ["resnet-tiny"], "world_size": [2], "image_size": [32], "batch_size": [8],
                       "bucket_mb": [5.0], "iters": [20], "warmup": [3], "threads": [1], "link": ["2.5gbit"]}},
    # the paper's models at the CPU input sizes of the main job
    "paper-cpu": {"replicas": 1, "rounds": 4, "seconds": 60,
              "grid": {"impl": ["ddp_core"],
                       "model": ["resnet50", "bert-base"], "world_size": [2], "image_size": [32], "seq_len": [16],
                       "batch_size": [2], "iters": [10], "warmup": [3], "threads": [1]}},
}


# The default threshold per mode: an interleaved A/B's interval is narrow enough (about +-3% at 99%)
# that a 5% slowdown clears a 3% threshold; rounds in fresh processes are far noisier.
THRESHOLDS = {"iterations": 0.03, "processes": 0.05}
QUIET = QUIET_CORES  # cores other processes may keep busy before ab calls the machine not quiet
# A run on a busy machine is measured again this many times at most: in the drill's truth runs, runs
# during which other processes kept 0.4-0.8 cores busy were the outliers of the per-round ratios.
QUIET_RETRIES = 2


@contextlib.contextmanager
def worktrees(repo: Path, commits: dict[str, str], parent: Path):
    """Check out each commit in a detached worktree under `parent` (by name; a `ddpbench-` temporary
    folder); remove them afterwards. First removes the worktrees that killed ddpbench runs left in `repo`
    (see prune_worktrees: only ddpbench's own, only those whose run is gone)."""
    for path in prune_worktrees(repo):
        print(f"ddpbench: removed the worktree {path}, which a killed ddpbench run left", file=sys.stderr)
    trees: dict[str, Path] = {}
    try:
        for name, commit in commits.items():
            trees[name] = parent / name  # first: removed below even if adding it is cut short
            add_worktree(repo, parent / name, commit)
        yield trees
    finally:
        with network.signals_held():  # a second Ctrl-C must not leave a worktree registered
            for tree in trees.values():
                remove_worktree(repo, tree)


# How long an interrupted `ddpbench run` gets to remove what it made (ranks, emulated network) after
# SIGTERM before it is killed.
STOP_WAIT_S = 30.0


def run_child(command: list[str], **popen) -> subprocess.CompletedProcess:
    """subprocess.run with output captured, except that an interruption (Ctrl-C, SIGTERM) stops the child
    politely: SIGTERM, up to STOP_WAIT_S for it to clean up, then SIGKILL (subprocess.run kills it at once,
    and a `ddpbench run` killed so leaves its network namespaces behind)."""
    with subprocess.Popen(command, **popen) as child:
        try:
            while True:
                try:  # in short waits: a Ctrl-C is acted on within a second, whatever the read in progress
                    out, err = child.communicate(timeout=1.0)
                    break
                except subprocess.TimeoutExpired:
                    continue
        except BaseException:
            with network.signals_held():  # more Ctrl-C must not cut the wait short
                stop_child(child)
            raise
    return subprocess.CompletedProcess(command, child.returncode, out, err)


def stop_child(child: subprocess.Popen, wait_s: float = STOP_WAIT_S) -> None:
    """SIGTERM `child`, wait up to `wait_s` seconds for it to exit (reading its pipes), then SIGKILL it."""
    if child.poll() is None:
        child.terminate()
    try:
        child.communicate(timeout=wait_s)
    except subprocess.TimeoutExpired:
        child.kill()
        child.communicate()


def preset_args(preset: str) -> list[str]:
    """The preset's grid as `ddpbench run` arguments (a revision under test is run through its own CLI)."""
    return to_argv(PRESETS[preset]["grid"])


def run_commands(preset: str, separate: bool) -> list[list[str]]:
    """The `ddpbench run` argument lists of one round of the preset: one list, or with `separate` one
    per model of its model list (each model then runs in processes of its own)."""
    grid = PRESETS[preset]["grid"]
    models = [[model] for model in grid["model"]] if separate else [grid["model"]]
    return [to_argv({**grid, "model": chosen}) for chosen in models]


def run_round(tree: Path, preset: str, out: Path, tag: dict, separate: bool | None = None,
              retries: int = QUIET_RETRIES) -> str | None:
    """One run of the preset with the revision checked out in `tree` (same environment, its own code);
    its successful records are appended to `out`, tagged with `"round": tag` plus `other_load`, the
    cores that other processes kept busy meanwhile on average, and `attempts`. A run during which other
    processes kept more than QUIET cores busy is discarded and run again, up to `retries` times (the
    last attempt is kept whatever the load). `separate` (default: the preset's setting) runs each model
    in fresh processes of its own. None if it worked, else why not (exit status and the end of its
    error output)."""
    separate = PRESETS[preset].get("separate", False) if separate is None else separate
    for attempt in range(1, retries + 2):
        with tempfile.TemporaryDirectory(prefix="ddpbench-round-") as tmp:
            raw = Path(tmp) / "round.jsonl"
            before, started = cpu_seconds(), time.monotonic()
            for args in run_commands(preset, separate):
                command = [sys.executable, "-m", "experiments", "run", *args, "--out", str(raw)]
                done = run_child(command, cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)},
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                tail = "\n".join(done.stderr.strip().splitlines()[-5:])
                if done.returncode != 0:
                    return f"`ddpbench run` exited with status {done.returncode}: {tail}"
            after, wall = cpu_seconds(), time.monotonic() - started
            other = other_cores_busy(before, after, wall)
            if other is not None and other > QUIET and attempt <= retries:
                continue  # measured on a busy machine: its medians move, measure again
            try:
                records = [r for r in read_records(raw) if r.get("status") == "ok"] if raw.exists() else []
            except SchemaError as error:
                return str(error)
            if not records:
                return f"`ddpbench run` recorded no successful config: {tail}"
            for record in records:
                append_record(out, {**record, "round": {**tag, "other_load": other, "attempts": attempt}})
            return None
    return None  # not reached: the last attempt always returns


def other_load(files: list[Path]) -> dict | None:
    """Mean and max over the runs of the cores other processes kept busy (see run_round)."""
    # One load per run: per round in fresh processes; per config (all its blocks) when interleaved.
    loads = {(file, r["round"]["session"], config_key(r["config"]) if r["round"].get("interleaved")
              else r["round"]["index"]): r["round"].get("other_load")
             for file in files for r in read_records(file) if isinstance(r.get("round"), dict)}
    values = [v for v in loads.values() if v is not None]
    return {"mean": sum(values) / len(values), "max": max(values)} if values else None


def warn_outside_ddp_core(repo: Path, revisions: dict[str, str]) -> None:
    """Say which changed Python files outside ddp_core/ (and tests/) an interleaved A/B does not measure."""
    changed = git("diff", "--name-only", "--end-of-options", revisions["base"], revisions["head"], cwd=repo).splitlines()
    outside = [f for f in changed if f.endswith(".py") and not f.startswith(("ddp_core/", "tests/"))]
    if outside:
        print(f"ddpbench ab: warning: HEAD also changes {len(outside)} Python file(s) outside ddp_core/ "
              f"({', '.join(outside[:3])}{', ...' if len(outside) > 3 else ''}), which --interleave iterations runs "
              "from this tree and does not measure; --interleave processes does", file=sys.stderr)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `ab` sub-command's options."""
    parser.add_argument("base_rev", help="the revision to compare against (e.g. HEAD~1, a tag, a hash)")
    parser.add_argument("head_rev", nargs="?", default="HEAD", help="the revision under test (default HEAD)")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="smoke")
    parser.add_argument("--interleave", choices=("iterations", "processes"), default="iterations",
                        help="iterations (default): both revisions' ddp_core in one set of processes, taking turns "
                             "iteration by iteration (interleaved.py; measures changes to ddp_core only); processes: "
                             "each round runs each revision whole, in fresh processes (any change, much noisier)")
    defaults = lambda key: ", ".join(f"{name} {p[key]:g}" for name, p in PRESETS.items())  # noqa: E731
    parser.add_argument("--rounds", type=int, help=f"--interleave processes only: A/B rounds (default: the preset's, "
                                                   f"{defaults('rounds')})")
    parser.add_argument("--seconds", type=float, help="--interleave iterations only: measured seconds per config "
                                                      f"(default: the preset's, {defaults('seconds')})")
    parser.add_argument("--threshold", type=float,
                        help=f"relative slowdown that counts (default {THRESHOLDS['iterations']} with --interleave "
                             f"iterations, {THRESHOLDS['processes']} with processes)")
    parser.add_argument("--confidence", type=float, default=0.99)
    parser.add_argument("--busy-retries", type=int,
                        help=f"--interleave processes only: runs again a run during which other processes kept more "
                             f"than {QUIET} cores busy, at most this many times (default {QUIET_RETRIES})")
    parser.add_argument("--keep", type=Path, help="keep the records in this new folder (base.jsonl, head.jsonl)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    parser.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[2], help=argparse.SUPPRESS)


@dataclass(frozen=True)
class ABOptions:
    """What `ddpbench ab` compares, and how (its flags, typed; None: the preset's or the mode's default)."""

    base_rev: str
    head_rev: str = "HEAD"
    preset: str = "smoke"
    interleave: str = "iterations"
    rounds: int | None = None
    seconds: float | None = None
    threshold: float | None = None
    confidence: float = 0.99
    busy_retries: int | None = None
    keep: Path | None = None
    json: bool = False
    repo: Path = Path(__file__).resolve().parents[2]


def main(options: ABOptions) -> int:
    """Check out both revisions, run the preset alternately, compare; 1 if HEAD is slower, 2 on bad input."""
    from experiments.args import check_folder  # cli imports this module

    rounds = options.rounds if options.rounds is not None else PRESETS[options.preset]["rounds"]
    measure_s = options.seconds if options.seconds is not None else PRESETS[options.preset]["seconds"]
    threshold = options.threshold if options.threshold is not None else THRESHOLDS[options.interleave]
    retries = options.busy_retries if options.busy_retries is not None else QUIET_RETRIES
    try:
        other_mode = {"iterations": ("rounds", "busy_retries"), "processes": ("seconds",)}[options.interleave]
        for name in other_mode:
            if getattr(options, name) is not None:
                raise ConfigError(f"--{name.replace('_', '-')}={getattr(options, name)} has no effect with "
                                  f"--interleave {options.interleave}; leave it out, or choose the other --interleave")
        if options.interleave == "iterations":
            if not 0 < measure_s < math.inf:
                raise ConfigError(f"--seconds={measure_s} is not allowed; it must be a number > 0")
            # refuses what it cannot run, before any process
            interleaved.preset_configs(PRESETS[options.preset]["grid"])
        elif rounds < MIN_PAIRED_ROUNDS:
            raise ConfigError(f"--rounds={rounds} is not allowed; it must be >= {MIN_PAIRED_ROUNDS} (rounds are "
                              "compared pairwise)")
        check_verdict_options(threshold, options.confidence)
        if retries < 0:
            raise ConfigError(f"--busy-retries={retries} is not allowed; it must be >= 0")
        if options.keep and any((options.keep / f"{name}.jsonl").exists() for name in ("base", "head")):
            raise ConfigError(f"--keep={str(options.keep)!r} already holds records; choose a new folder")
        if options.keep:
            check_folder(options.keep, "keep")
        revisions = {name: resolve_commit(rev, options.repo, name.upper())
                     for name, rev in (("base", options.base_rev), ("head", options.head_rev))}
    except ConfigError as error:
        print(f"ddpbench ab: error: {error}", file=sys.stderr)
        return 2
    if options.interleave == "iterations":
        warn_outside_ddp_core(options.repo, revisions)
    session = f"ab-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ddpbench-ab-") as tmp:
        out_dir = options.keep or Path(tmp)
        out_dir.mkdir(parents=True, exist_ok=True)
        with worktrees(options.repo, revisions, Path(tmp)) as trees:
            if options.interleave == "iterations":
                print(f"ab: {options.preset} preset, both revisions' ddp_core in one set of processes per config, "
                      f"taking turns iteration by iteration for about {measure_s:g} s", file=sys.stderr, flush=True)
                try:
                    interleaved.run(trees, PRESETS[options.preset]["grid"], measure_s, out_dir, session,
                                    PRESETS[options.preset]["replicas"])
                except Exception as error:  # exit 1 would read as "slower": any failure is 2
                    print(f"ddpbench ab: the revisions cannot run the {options.preset} preset interleaved "
                          f"({type(error).__name__}): {error}", file=sys.stderr)
                    return 2
            for index in range(rounds if options.interleave == "processes" else 0):
                for name in ("base", "head") if index % 2 == 0 else ("head", "base"):
                    print(f"ab round {index + 1}/{rounds}: {name} ({revisions[name][:10]})", file=sys.stderr,
                          flush=True)
                    try:
                        error = run_round(trees[name], options.preset, out_dir / f"{name}.jsonl",
                                          {"session": session, "index": index}, retries=retries)
                    except OSError as failure:  # the disk filled up: one line, and not "slower"
                        error = str(failure)
                    if error:
                        print(f"ddpbench ab: the {name} revision ({revisions[name][:10]}) cannot run the "
                              f"{options.preset} preset: {error}", file=sys.stderr)
                        return 2
        try:  # exit 1 would read as "slower": a record that cannot be read is a failure, 2
            rows = compare(out_dir / "base.jsonl", out_dir / "head.jsonl", threshold, options.confidence)
        except RecordError as error:
            print(f"ddpbench ab: error: {error}", file=sys.stderr)
            return 2
        other = other_load([out_dir / "base.jsonl", out_dir / "head.jsonl"])
    seconds = time.monotonic() - started
    how = f"{rounds} rounds" if options.interleave == "processes" else "interleaved iteration by iteration"
    if options.json:
        print(json.dumps({"base": revisions["base"], "head": revisions["head"], "preset": options.preset,
                          "interleave": options.interleave, "threshold": threshold,
                          "rounds": rounds if options.interleave == "processes" else None, "seconds": seconds,
                          "other_load": other, "rows": rows}, indent=1))
    else:
        print(f"base {options.base_rev} ({revisions['base'][:10]}) -> head {options.head_rev} "
              f"({revisions['head'][:10]}), "
              f"{options.preset} preset, {how} in {seconds:.0f} s, threshold {threshold:.0%}")
        print(format_table(rows))
        if other:
            noisy = "; the machine was not quiet, so the intervals are wider" if other["max"] > QUIET else ""
            print(f"other processes kept {other['mean']:.2f} cores busy on average during the runs (at most "
                  f"{other['max']:.2f}){noisy}")
    return 1 if any(row["verdict"] == "slower" for row in rows) else 0
