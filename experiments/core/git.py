"""Git, as the suite calls it: every revision a user gives goes after `--end-of-options`."""
from __future__ import annotations

import subprocess
from pathlib import Path

from experiments.core.config import ConfigError


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
