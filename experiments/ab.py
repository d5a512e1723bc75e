"""`ddpbench ab BASE_REV [HEAD_REV]`: A/B two commits on this machine, in one job.

Both revisions are checked out in temporary git worktrees that share the installed environment. A
preset of configs runs on each, alternating A B A B over several rounds, so that drift of a shared,
noisy machine hits both alike; then the records are compared (see compare.py). Exit status: 1 if
HEAD is significantly slower than BASE by more than the threshold on any config, 0 otherwise.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from .compare import compare, format_table
from .config import ConfigError

# preset -> `ddpbench run` arguments (without --out)
PRESETS = {
    # tiny models: the whole A/B ends within a few minutes on 2 cores
    "smoke": ["--model", "resnet-tiny,bert-tiny", "--world-size", "2", "--image-size", "16", "--seq-len", "16",
              "--batch-size", "4", "--iters", "15", "--warmup", "3", "--threads", "1"],
    # the paper's models at the CPU input sizes of the main job
    "paper-cpu": ["--model", "resnet50,bert-base", "--world-size", "2", "--image-size", "32", "--seq-len", "16",
                  "--batch-size", "2", "--iters", "10", "--warmup", "3", "--threads", "1"],
}


def git(*args: str, cwd: Path) -> str:
    """Run git; raise ConfigError with its message if it fails."""
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        raise ConfigError(f"git {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout.strip()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `ab` sub-command's options."""
    parser.add_argument("base_rev", help="the revision to compare against (e.g. HEAD~1, a tag, a hash)")
    parser.add_argument("head_rev", nargs="?", default="HEAD", help="the revision under test (default HEAD)")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="smoke")
    parser.add_argument("--rounds", type=int, default=4, help="A B rounds (default 4)")
    parser.add_argument("--threshold", type=float, default=0.05)
    parser.add_argument("--confidence", type=float, default=0.99)
    parser.add_argument("--keep", type=Path, help="keep the records in this folder (base.jsonl, head.jsonl)")
    parser.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[1], help=argparse.SUPPRESS)


def main(args: argparse.Namespace) -> int:
    """Check out both revisions, run the preset alternately, compare; 1 if HEAD is slower, 2 on bad input."""
    try:
        if args.rounds < 1:
            raise ConfigError(f"--rounds={args.rounds} is not allowed; it must be >= 1")
        revisions = {name: git("rev-parse", "--verify", f"{rev}^{{commit}}", cwd=args.repo)
                     for name, rev in (("base", args.base_rev), ("head", args.head_rev))}
    except ConfigError as error:
        print(f"ddpbench ab: error: {error}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="ddpbench-ab-") as tmp:
        tmp = Path(tmp)
        out_dir = args.keep or tmp
        out_dir.mkdir(parents=True, exist_ok=True)
        trees = {}
        try:
            for name, commit in revisions.items():
                trees[name] = tmp / name
                git("worktree", "add", "--detach", str(trees[name]), commit, cwd=args.repo)
            for round_index in range(args.rounds):
                order = ("base", "head") if round_index % 2 == 0 else ("head", "base")
                for name in order:
                    print(f"ab round {round_index + 1}/{args.rounds}: {name} ({revisions[name][:10]})", flush=True)
                    status = _run_preset(trees[name], args.preset, out_dir / f"{name}.jsonl")
                    if status != 0:
                        print(f"ddpbench ab: the {name} revision failed to run the preset (status {status})",
                              file=sys.stderr)
                        return 2
        finally:
            for tree in trees.values():
                subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=args.repo,
                               capture_output=True)
        rows = compare(out_dir / "base.jsonl", out_dir / "head.jsonl", args.threshold, args.confidence)
    print(f"base {args.base_rev} ({revisions['base'][:10]}) -> head {args.head_rev} ({revisions['head'][:10]})")
    print(format_table(rows))
    return 1 if any(row["verdict"] == "slower" for row in rows) else 0


def _run_preset(tree: Path, preset: str, out: Path) -> int:
    """One round of the preset with that revision's own code (same environment, its own PYTHONPATH)."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    command = [sys.executable, "-m", "experiments", "run", *PRESETS[preset], "--out", str(out)]
    return subprocess.run(command, cwd=tree, env=env, stdout=subprocess.DEVNULL).returncode
