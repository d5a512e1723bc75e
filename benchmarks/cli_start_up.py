"""How long the command line takes to answer `--help` and a bad flag: wall time of whole processes.

    source scripts/env.sh && python benchmarks/cli_start_up.py --repeats 10 --compare-to main

Times `./ddpbench --help`, `./ddpbench run --bad-flag` (the wrapper: the environment's check and
activation, then Python) and `python -m experiments --help`, each `--repeats` times, interleaved (one
of each command in turn, and of each tree with --compare-to) so that a change of load on the machine
falls on all alike. With `--compare-to REF`, the same commands also run in a temporary git worktree
of REF, removed afterwards. Each command runs once untimed first (the file cache, Python's bytecode).
Prints per command and tree the median and the range [min, max], then every raw sample.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from experiments.core.git import add_worktree, remove_worktree, resolve_commit  # noqa: E402

# Each command with the exit status it must end with: a tree that fails otherwise is not measured fast.
COMMANDS = {"./ddpbench --help": 0, "./ddpbench run --bad-flag": 2, "python -m experiments --help": 0}


def run_once(tree: Path, command: str) -> float:
    """Seconds one command takes in `tree`, from starting the process until it has exited."""
    argv = command.split()
    if argv[0] == "python":
        argv[0] = sys.executable
    env = {**os.environ, "PYTHONPATH": str(tree)}  # this tree's experiments, not the one of the caller's path
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != COMMANDS[command]:
        raise SystemExit(f"{tree}: `{command}` exited {done.returncode}, not {COMMANDS[command]}:\n{done.stderr}")
    return seconds


def measure(trees: dict[str, Path], repeats: int) -> dict[tuple[str, str], list[float]]:
    """(tree name, command) -> seconds of each repeat, interleaved; one untimed run of each first."""
    for tree in trees.values():
        for command in COMMANDS:
            run_once(tree, command)
    samples = {(name, command): [] for command in COMMANDS for name in trees}  # printed command by command
    for _ in range(repeats):
        for name, tree in trees.items():
            for command in COMMANDS:
                samples[(name, command)].append(run_once(tree, command))
    return samples


def main() -> None:
    """Print median and range per command and tree, then the raw samples."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=10, help="timed runs of each command (default 10)")
    parser.add_argument("--compare-to", metavar="REF", help="also time a git revision, e.g. main or HEAD~1")
    args = parser.parse_args()
    trees, scratch = {"this tree": ROOT}, None
    try:
        if args.compare_to:
            commit = resolve_commit(args.compare_to, ROOT, "--compare-to")
            scratch = Path(tempfile.mkdtemp(prefix="ddpbench-start-up-"))  # ddpbench-: prune_worktrees knows it
            add_worktree(ROOT, scratch / "tree", commit)
            trees[f"{args.compare_to} ({commit[:10]})"] = scratch / "tree"
        samples = measure(trees, args.repeats)
    finally:
        if scratch is not None:
            remove_worktree(ROOT, scratch / "tree")
            shutil.rmtree(scratch, ignore_errors=True)
    note = "; PYTHONDONTWRITEBYTECODE is set: Python compiles the project's files on every start" \
        if os.environ.get("PYTHONDONTWRITEBYTECODE") else ""
    print(f"# python benchmarks/cli_start_up.py --repeats {args.repeats}"
          f"{f' --compare-to {args.compare_to}' if args.compare_to else ''} (python {sys.version.split()[0]}, "
          f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}{note})")
    width = max(len(command) for command in COMMANDS)
    print(f"{'command':<{width}}  {'tree':<24} median s  [min, max]")
    for (name, command), seconds in samples.items():
        print(f"{command:<{width}}  {name:<24} {statistics.median(seconds):8.3f}  [{min(seconds):.3f}, {max(seconds):.3f}]")
    print("\nraw samples (s):")
    for (name, command), seconds in samples.items():
        print(f"{command} | {name}: {' '.join(f'{s:.3f}' for s in seconds)}")


if __name__ == "__main__":
    main()
