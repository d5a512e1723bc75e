"""Doors a run must keep shut and rooms it must leave empty: the rendezvous store and the ranks listen on
loopback (or inside the emulated network) alone; Ctrl-C, however often, leaves no network namespace; an
interrupted A/B stops its child `ddpbench run` with SIGTERM and waits for it; a killed A/B's worktrees
are pruned by the next one, and nobody else's are."""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from experiments.emulate import network
from experiments.regression import ab
from tests.processes import wait_for

ROOT = Path(__file__).resolve().parents[2]


STUB_MAIN = '''
import os, signal, sys, time
from pathlib import Path
marks = Path(os.environ["DDPBENCH_STUB_MARKS"])
def stop(signum, frame):
    (marks / "sigterm").touch()
    time.sleep(0.5)  # as a run removing its namespaces
    (marks / "cleaned").touch()
    sys.exit(130)
signal.signal(signal.SIGTERM, stop)
(marks / "pid").write_text(str(os.getpid()))
time.sleep(120)
'''


def _stub_tree(tmp_path: Path) -> Path:
    """A checkout whose `python -m experiments run` only waits, noting the signals it gets."""
    tree = tmp_path / "tree"
    (tree / "experiments").mkdir(parents=True)
    (tree / "experiments" / "__init__.py").write_text("")
    (tree / "experiments" / "__main__.py").write_text(STUB_MAIN)
    return tree


@pytest.mark.timeout(120)
def test_an_interrupted_round_stops_its_child_with_sigterm_and_waits(tmp_path, monkeypatch):
    marks = tmp_path / "marks"
    marks.mkdir()
    monkeypatch.setenv("DDPBENCH_STUB_MARKS", str(marks))
    signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C raises here, whatever ran before
    main_thread = threading.main_thread().ident

    def ctrl_c_once_started():
        wait_for(lambda: (marks / "pid").exists(), 60)
        signal.pthread_kill(main_thread, signal.SIGINT)  # as Ctrl-C (or SIGTERM, which ddpbench turns into it)

    threading.Thread(target=ctrl_c_once_started, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        ab.run_round(_stub_tree(tmp_path), "quick", tmp_path / "out.jsonl", {"session": "s", "index": 0})
    assert (marks / "sigterm").exists(), "the child was not sent SIGTERM (killed outright?)"
    assert (marks / "cleaned").exists(), "the child was not given the time to clean up"
    assert not Path(f"/proc/{(marks / 'pid').read_text()}").exists()


def test_a_child_that_ignores_sigterm_is_killed_after_the_wait():
    child = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
                              "signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"],
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready"
    started = time.monotonic()
    ab.stop_child(child, wait_s=0.5)
    assert child.returncode == -signal.SIGKILL and time.monotonic() - started < 10


def _git(*args, cwd) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()


def _worktrees(repo: Path) -> list[str]:
    return [line.split(" ", 1)[1] for line in _git("worktree", "list", "--porcelain", cwd=repo).splitlines()
            if line.startswith("worktree ")][1:]


@pytest.mark.timeout(180)
def test_a_killed_ab_leaves_worktrees_the_next_one_prunes_and_nobody_elses(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    repo.mkdir()
    _git("init", "-q", cwd=repo)
    _git("-c", "user.name=t", "-c", "user.email=t@t.invalid", "commit", "-q", "--allow-empty", "-m", "one", cwd=repo)
    commit = _git("rev-parse", "HEAD", cwd=repo)
    made = []  # every folder this test makes in the temporary directory, removed at the end
    try:
        # An `ab` killed (SIGKILL) while its two worktrees are checked out: no clean-up of its own runs.
        killed = subprocess.run([sys.executable, "-c", f"""
import os, tempfile
from pathlib import Path
from experiments.regression.ab import worktrees
parent = Path(tempfile.mkdtemp(prefix="ddpbench-ab-"))
print(parent, flush=True)
held = worktrees(Path({str(repo)!r}), {{"base": {commit!r}, "head": {commit!r}}}, parent)
held.__enter__()
os.kill(os.getpid(), 9)
"""], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        made.append(Path(killed.stdout.strip()))
        left = _worktrees(repo)
        assert sorted(left) == [str(made[0] / "base"), str(made[0] / "head")] and all(map(os.path.isdir, left))
        # A ddpbench worktree of an older run whose folder is gone; one of a run still going (this process);
        # the user's own, one of them with its folder gone (on a drive not mounted now, say).
        gone = Path(tempfile.mkdtemp(prefix="ddpbench-history-"))
        live = Path(tempfile.mkdtemp(prefix="ddpbench-truth-"))
        made += [gone, live]
        _git("worktree", "add", "-q", "--detach", str(gone / "c"), commit, cwd=repo)
        shutil.rmtree(gone / "c")
        from experiments.core.git import add_worktree

        add_worktree(repo, live / "c", commit)
        mine, mine_gone = tmp_path / "mine", tmp_path / "mine-gone"
        for path in (mine, mine_gone):
            _git("worktree", "add", "-q", "--detach", str(path), commit, cwd=repo)
        shutil.rmtree(mine_gone)

        new = Path(tempfile.mkdtemp(prefix="ddpbench-ab-"))
        made.append(new)
        with ab.worktrees(repo, {"base": commit}, new):
            assert sorted(_worktrees(repo)) == sorted([str(live / "c"), str(mine), str(mine_gone), str(new / "base")])
        assert sorted(_worktrees(repo)) == sorted([str(live / "c"), str(mine), str(mine_gone)])

        # `ddpbench network --cleanup` prunes them too (here: once this process, their owner, has let go).
        _git("worktree", "unlock", str(live / "c"), cwd=repo)
        _git("worktree", "lock", "--reason", f"ddpbench pid {_ended_pid()} started 1", str(live / "c"), cwd=repo)
        monkeypatch.setattr(network, "CHECKOUT", repo)
        monkeypatch.setattr(network, "cleanup", lambda: ([], []))  # namespaces are another test's
        assert network.main(network.NetworkOptions(cleanup=True)) == 0
        assert sorted(_worktrees(repo)) == sorted([str(mine), str(mine_gone)])
    finally:
        for path in _worktrees(repo):
            subprocess.run(["git", "worktree", "remove", "--force", "--force", path], cwd=repo, capture_output=True)
        for folder in made:
            shutil.rmtree(folder, ignore_errors=True)


def _ended_pid() -> int:
    """The id of a process that has ended."""
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(done.stdout)


def _repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "a.txt").write_text("a\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    for command in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "one"]):
        subprocess.run([*git, *command], cwd=repo, check=True)
    (repo / "a.txt").write_text("b\n")
    subprocess.run([*git, "commit", "-qam", "two"], cwd=repo, check=True)
    return repo


@pytest.mark.parametrize("command", [["history", "--output={victim}..HEAD"], ["history", "HEAD~1..--output={victim}"],
                                     ["ab", "--output={victim}", "HEAD"], ["drill", "--base=--output={victim}"]])
def test_a_revision_is_never_read_by_git_as_an_option(tmp_path, capsys, command):
    from experiments.cli import main

    repo = _repo(tmp_path)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    argv = [part.format(victim=victim) for part in command]
    if argv[0] == "history":
        argv = ["history", "--repo", str(repo), "--results", str(tmp_path / "results"), "--", *argv[1:]]
    elif argv[0] == "ab":
        argv = ["ab", "--repo", str(repo), "--", *argv[1:]]
    else:
        argv = [*argv, "--repo", str(repo), "--out", str(tmp_path / "drill.json")]
    assert main(argv) == 2
    assert "is not a revision: a revision never starts with '-'" in capsys.readouterr().err
    assert victim.read_text() == "keep me\n"  # git wrote nothing
