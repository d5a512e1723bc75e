"""The regression drill's parts, without measuring: injections fit this tree and leave nothing behind,
the truth run appends whole rounds and resumes, the goals are judged against true sizes, bad input."""
import subprocess

from experiments.regression import injections
from tests.unit.test_regression import _scratch_repo


def test_injected_commits_are_reproducible_and_leave_no_worktree_or_branch(tmp_path):
    repo = _scratch_repo(tmp_path)
    base = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
    first = injections.commit_injections(repo, base, ["sleep-5", "barrier"])
    assert first == injections.commit_injections(repo, base, ["sleep-5", "barrier"])  # same hashes again
    show = subprocess.run(["git", "show", "--stat", first["barrier"]], cwd=repo, capture_output=True, text=True).stdout
    assert "ddp_core/reducer.py" in show and "drill: adds a barrier" in show
    worktrees = subprocess.run(["git", "worktree", "list"], cwd=repo, capture_output=True, text=True).stdout
    branches = subprocess.run(["git", "branch", "-a"], cwd=repo, capture_output=True, text=True).stdout
    assert len(worktrees.splitlines()) == 1 and len(branches.splitlines()) == 1, (worktrees, branches)
