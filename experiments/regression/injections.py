"""The drill's regressions: small patches to ddp_core of the kinds DDP commits really make, each
committed as a throwaway commit on top of a base commit.

A patch is a list of edits (file, anchor, replacement); every anchor must occur exactly once in the
base commit, so that a patch that no longer fits is refused instead of silently measuring nothing.
The commits are made in a temporary detached worktree and never land on a branch: they stay
reachable only by their hashes (git's garbage collection removes them later).
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
from pathlib import Path

from experiments.core.config import ConfigError
from experiments.core.git import add_worktree, git, prune_worktrees, remove_worktree
from experiments.emulate import network

REDUCER, DISTRIBUTED = "ddp_core/reducer.py", "ddp_core/distributed.py"
# The reducer's ready hooks and in-order launch, in this layout and in the one before it (all in reducer.py).
READY_HOOKS, LAUNCH_ORDER = ("ddp_core/ready_hooks.py", REDUCER), ("ddp_core/launch_order.py", REDUCER)
# The launcher's file, in this layout and in the one before it (a drill's base commit may be older).
LAUNCHER = ("experiments/measure/launch.py", "experiments/launch.py")
# The end of the reducer's end-of-backward callback: every all-reduce has completed and been written back.
END_OF_BACKWARD = "        self._locally_used = [False] * len(self.params)\n"
SLEEP = """        _time = __import__('time')  # drill: sleep {f:.0%} of this iteration's forward and backward so far
        _time.sleep({f} * (_time.perf_counter() - self._drill_mark))
"""
# Where the sleep's iteration starts: the wrapper's forward (anything before it, even another model's
# iteration in an interleaved A/B, does not count).
FORWARD_START = "        self.reducer.maybe_rebuild_buckets()\n"
MARK = "        self.reducer._drill_mark = __import__('time').perf_counter()  # drill\n"
# (the call alone: the line around it differs between ddp_core's versions, `bucket.future = ...` or `return ...`)
LAUNCH = "dist.all_reduce(bucket.buffer(), group=group, async_op=True).get_future()"
WAIT_START = "        if not self.overlap:\n            self._launch_complete_buckets()"
COPY_AT = "        if grad is None:\n            view.zero_()"


def _sleep(fraction: float) -> list[tuple[str, str, str]]:
    return [(DISTRIBUTED, FORWARD_START, MARK + FORWARD_START),
            (REDUCER, END_OF_BACKWARD, SLEEP.format(f=fraction) + END_OF_BACKWARD)]


# name -> (what a commit like it would do, its edits)
INJECTIONS: dict[str, tuple[str, list[tuple[str, str, str]]]] = {
    "sleep-2": ("sleeps 2% of forward and backward at the end of backward", _sleep(0.02)),
    "sleep-5": ("sleeps 5% of forward and backward at the end of backward", _sleep(0.05)),
    "sleep-10": ("sleeps 10% of forward and backward at the end of backward", _sleep(0.10)),
    "no-overlap": ("loses the overlap: buckets are all-reduced only after backward",
                   [(DISTRIBUTED, "first_bucket_cap_mb=first_bucket_cap_mb, overlap=overlap,",
                     "first_bucket_cap_mb=first_bucket_cap_mb, overlap=False,")]),
    "bucket-1mb": ("caps buckets at 1 MB instead of the cap asked for",
                   [(DISTRIBUTED, "            bucket_cap_mb=bucket_cap_mb, first_bucket_cap_mb",
                     "            bucket_cap_mb=min(bucket_cap_mb, 1.0), first_bucket_cap_mb")]),
    "barrier": ("adds a barrier per iteration after backward (an extra sync point)",
                [(REDUCER, WAIT_START, "        dist.barrier(group=self.groups[0])  # drill\n" + WAIT_START)]),
    "grad-copy": ("copies every gradient once more on its way into the bucket",
                  [(READY_HOOKS, COPY_AT, "        if grad is not None:\n            grad = grad.clone()  # drill\n"
                    + COPY_AT)]),
    "hook-then": ("unwraps every bucket's all-reduce through a Python callback on Gloo's thread",
                  [(LAUNCH_ORDER, LAUNCH, LAUNCH + ".then(lambda fut: fut.value()[0])")]),
}
# Changes to the instrument, not regressions: tried against the noise of same-against-same ratios.
VARIANTS: dict[str, tuple[str, list[tuple[str, str, str]]]] = {
    "pinned": ("pins local rank r to core r (mod the cores)",
               [(LAUNCHER, "    _end_with_run(parent_pid)\n",
                 "    _end_with_run(parent_pid)\n    os.sched_setaffinity(0, {rank % os.cpu_count()})  # noise trial\n")]),
}
GIT_USER = ["-c", "user.name=ddpbench-drill", "-c", "user.email=drill@ddpbench.invalid"]


def check_names(names: list[str]) -> None:
    """Raise ConfigError for an unknown injection name, listing the known ones."""
    unknown = [n for n in names if n not in INJECTIONS]
    if unknown:
        raise ConfigError(f"--regressions: {', '.join(map(repr, unknown))} not known; choose from "
                          f"{', '.join(INJECTIONS)}")


def apply(tree: Path, name: str) -> None:
    """Apply injection `name` to the files of `tree`; ConfigError if an anchor is missing or repeated."""
    for paths, anchor, replacement in {**INJECTIONS, **VARIANTS}[name][1]:
        candidates = (paths,) if isinstance(paths, str) else paths
        path = next((p for p in candidates if (tree / p).exists()), candidates[0])
        text = (tree / path).read_text()
        if text.count(anchor) != 1:
            raise ConfigError(f"regression {name!r} does not fit this base commit: {path} holds "
                              f"{text.count(anchor)} copies of {anchor.strip()[:60]!r}, not one")
        (tree / path).write_text(text.replace(anchor, replacement))


def commit_injections(repo: Path, base: str, names: list[str]) -> dict[str, str]:
    """Commit each injection on top of `base` in a temporary worktree (removed afterwards, also on errors
    and Ctrl-C); return name -> commit hash. No branch or ref is created."""
    commits: dict[str, str] = {}
    # Dated as the base commit: the same injection on the same base gets the same hash every time.
    date = git("log", "-1", "--format=%cI", base, cwd=repo)
    env = {**os.environ, "GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date}
    prune_worktrees(repo)  # those of killed runs (ddpbench's own only)
    with tempfile.TemporaryDirectory(prefix="ddpbench-drill-inject-") as tmp:
        tree = Path(tmp) / "tree"
        try:
            add_worktree(repo, tree, base)
            for name in names:
                git("checkout", "-q", "--detach", base, cwd=tree)
                apply(tree, name)
                what = {**INJECTIONS, **VARIANTS}[name][0]
                subprocess.run(["git", *GIT_USER, "commit", "-qam", f"drill: {what}"], cwd=tree, env=env, check=True,
                               capture_output=True)
                commits[name] = git("rev-parse", "HEAD", cwd=tree)
        finally:
            with contextlib.suppress(OSError), network.signals_held():  # a second Ctrl-C must not leave it registered
                remove_worktree(repo, tree)
    return commits
