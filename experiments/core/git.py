"""Git, as the suite calls it: every revision a user gives goes after `--end-of-options`."""
from __future__ import annotations

import os
import re
import subprocess
import tempfile
from pathlib import Path

from experiments.core.config import ConfigError
from experiments.core.procfs import process_stat


def git(*args: str, cwd: Path) -> str:
    """Run git; raise ConfigError with its message if it fails."""
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        raise ConfigError(f"git {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout.strip()


def git_or_empty(*args: str, cwd: Path) -> str:
    """Run git for information only (a record's commit): "" where git or the repository is missing."""
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, timeout=10, cwd=cwd).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _check_revision(revision: str, flag: str) -> None:
    # git reads an argument that starts with '-' as an option (--output=FILE makes it write files):
    # a revision never starts with one.
    if not revision or revision.startswith("-"):
        raise ConfigError(f"{flag} {revision!r} is not a revision: a revision never starts with '-' (a commit hash, "
                          "a branch or tag name, HEAD~3, or a range A..B)")


def resolve_commit(revision: str, repo: Path, flag: str = "revision") -> str:
    """The full hash of the commit `revision` names in `repo`; ConfigError naming the flag otherwise.
    The revision goes after `--end-of-options`: git never reads it as an option."""
    _check_revision(revision, flag)
    done = subprocess.run(["git", "rev-parse", "--verify", "--quiet", "--end-of-options", f"{revision}^{{commit}}"],
                          cwd=repo, capture_output=True, text=True)
    if done.returncode != 0:
        raise ConfigError(f"{flag} {revision!r} is not a commit in {repo}")
    return done.stdout.strip()


def commits_in_range(revision_range: str, repo: Path, flag: str = "revision range") -> list[str]:
    """The commits of `A..B`, oldest first (after `--end-of-options`); ConfigError naming the range otherwise."""
    _check_revision(revision_range, flag)
    for end in revision_range.split(".."):
        if end.startswith("-"):
            _check_revision(end, flag)
    done = subprocess.run(["git", "rev-list", "--reverse", "--end-of-options", revision_range, "--"],
                          cwd=repo, capture_output=True, text=True)
    if done.returncode != 0:
        raise ConfigError(f"{flag} {revision_range!r} is not valid ({done.stderr.strip()})")
    return done.stdout.split()


# ddpbench's own worktrees: under a temporary folder named ddpbench-..., locked with their owner's
# process id and start time, so that a later run can tell one a killed run left from a running one's.
WORKTREE_PREFIX = "ddpbench-"
_OWNER = re.compile(r"^ddpbench pid (\d+) started (\d+)$")


def add_worktree(repo: Path, path: Path, commit: str) -> None:
    """Check out `commit` in a detached worktree at `path` (under a `ddpbench-` temporary folder), locked
    with this process as its owner (see prune_worktrees); ConfigError if git refuses."""
    git("worktree", "add", "--detach", str(path), commit, cwd=repo)
    # The lock names its owner; it also keeps a user's `git worktree prune` off a running A/B's trees.
    git("worktree", "lock", "--reason", f"ddpbench pid {os.getpid()} started {_start_time(os.getpid())}", str(path),
        cwd=repo)


def remove_worktree(repo: Path, path: Path) -> None:
    """Remove the worktree at `path`, locked or not, its folder there or gone (quietly: clean-up)."""
    subprocess.run(["git", "worktree", "remove", "--force", "--force", str(path)], cwd=repo, capture_output=True)


def prune_worktrees(repo: Path) -> list[str]:
    """Remove ddpbench's stale worktrees from `repo`'s list, and return their paths: those under a
    `ddpbench-` folder of the temporary directory whose owner process is gone, or (left by a run that
    did not lock them) whose folder is gone. Nobody else's worktree is touched, gone or not."""
    try:
        listing = subprocess.run(["git", "worktree", "list", "--porcelain"], cwd=repo, capture_output=True,
                                 text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return []
    removed = []
    for entry in listing.stdout.split("\n\n") if listing.returncode == 0 else []:
        fields = dict((line.split(" ", 1) + [""])[:2] for line in entry.splitlines())
        if "worktree" in fields and _stale(Path(fields["worktree"]), fields.get("locked")):
            remove_worktree(repo, Path(fields["worktree"]))
            removed.append(fields["worktree"])
    return removed


def _stale(path: Path, lock: str | None) -> bool:
    temp = Path(tempfile.gettempdir()).resolve()
    if not (path.is_relative_to(temp) and path != temp
            and path.relative_to(temp).parts[0].startswith(WORKTREE_PREFIX)):
        return False  # not ddpbench's
    owner = _OWNER.match(lock or "")
    if owner:
        return _start_time(int(owner.group(1))) != owner.group(2)  # its process is gone (or the pid reused)
    return lock is None and not path.exists()  # unlocked: only once its folder is gone


def _start_time(pid: int) -> str | None:
    """When process `pid` started (clock ticks since boot, /proc/PID/stat), None if there is none."""
    fields = process_stat(pid)
    return None if fields is None else fields[19]  # field 22
