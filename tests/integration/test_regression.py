"""Regression testing: compare's verdicts (pooled and paired by round) and exit codes, A/B and history of
real revisions in a throwaway repo."""
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from experiments.cli import main
from experiments.core.machine import machine_name
from experiments.core.records import read_records
from experiments.regression import history
from tests.unit.test_regression import _scratch_repo


def _commit(repo: Path, message: str) -> str:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", message], cwd=repo,
                   check=True)
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()


def _slow_down(repo: Path, seconds: float) -> None:
    """Sleep `seconds` in every iteration, in ddp_core's end-of-backward callback once the all-reduces
    are complete (as benchmarks/ab_validation.py does)."""
    reducer = repo / "ddp_core" / "reducer.py"
    anchor = "        self._locally_used = [False] * len(self.params)\n"
    assert reducer.read_text().count(anchor) == 1
    reducer.write_text(reducer.read_text().replace(anchor, f"        __import__('time').sleep({seconds})\n" + anchor))


def _ab(repo: Path, base: str, head: str, *extra: str) -> subprocess.CompletedProcess:
    # A 10% threshold: the test checks the plumbing, not the gate's resolution (the drill measures that).
    return subprocess.run([sys.executable, "-m", "experiments", "ab", base, head, "--preset", "quick",
                           "--threshold", "0.1", "--repo", str(repo), *extra],
                          cwd=repo, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_ab_stays_quiet_on_identical_code_and_flags_a_slowed_commit(tmp_path):
    repo = _scratch_repo(tmp_path)
    same = _ab(repo, "HEAD", "HEAD")  # interleaved: both worktrees' ddp_core in one set of processes
    assert same.returncode == 0, same.stdout + same.stderr
    assert "interleaved iteration by iteration" in same.stdout
    # A throwaway commit that slows the measured path: 100 ms in the backward pass of every iteration.
    # Flagged only if each entry really runs its own revision's ddp_core (one module for both: ratio 1).
    _slow_down(repo, 0.1)
    _commit(repo, "slow")
    for extra in ([], ["--interleave", "processes", "--rounds", "3", "--busy-retries", "0"]):
        slowed = _ab(repo, "HEAD~1", "HEAD", *extra)
        assert slowed.returncode == 1, (extra, slowed.stdout + slowed.stderr)
        assert "+" in slowed.stdout.split("ratio", 1)[1]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_history_records_plots_and_skips_what_is_recorded(tmp_path, monkeypatch, capsys):
    repo = _scratch_repo(tmp_path)
    base = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
    _slow_down(repo, 0.05)
    slow = _commit(repo, "slow")
    (repo / "experiments" / "__main__.py").unlink()  # a commit whose runner cannot run
    broken = _commit(repo, "broken")
    results = tmp_path / "results"
    # The base commit, then the range after it (A..B leaves A out), as a user would list them.
    argv = ["history", "HEAD~2", "HEAD~2..HEAD", "--preset", "quick", "--rounds", "3", "--repo", str(repo),
            "--results", str(results), "--html", str(tmp_path / "site"), "--busy-retries", "0"]
    assert main(argv) == 0
    folder = results / "history" / machine_name() / "quick"
    closing = {c: history.closing_record(folder / f"{c}.jsonl", "quick") for c in (base, slow, broken)}
    assert [closing[c]["status"] for c in (base, slow, broken)] == ["ok", "ok", "failed"]
    assert "exited with status" in closing[broken]["error"]
    runs = [r for r in read_records(folder / f"{slow}.jsonl") if r["kind"] == "run"]
    assert len(runs) == 3 and runs[0]["env"]["git_commit"] == slow and runs[0]["round"]["index"] == 0
    figure = results / "figures" / f"history-{machine_name()}-quick.png"
    assert figure.stat().st_size > 0
    table = pd.read_csv(results / "tables" / f"history-{machine_name()}-quick.csv", dtype={"commit": str})
    [row] = table[table["commit"] == slow[:10]].to_dict("records")
    assert row["method"] == "paired x3" and row["ratio"] > 1.2  # against the base commit
    assert list(table[table["commit"] == broken[:10]]["status"]) == ["failed"]
    # The page links each commit's records, copied beside it (tests/integration/test_history_page.py renders one).
    site = (tmp_path / "site" / "index.html").read_text()
    assert all(f'href="records/{c}.jsonl"' in site and (tmp_path / "site" / "records" / f"{c}.jsonl").exists()
               for c in (base, slow, broken))
    # Everything is recorded now: a second call measures nothing and only redraws.
    monkeypatch.setattr(history, "run_round", lambda *a, **k: pytest.fail("measured a recorded commit"))
    before = {c: (folder / f"{c}.jsonl").read_bytes() for c in (base, slow, broken)}
    figure.unlink()
    assert main(argv) == 0
    assert before == {c: (folder / f"{c}.jsonl").read_bytes() for c in (base, slow, broken)}
    assert figure.exists()
    # Once the preset's arguments change, those records measure something else: they no longer count.
    changed = {**history.PRESETS["quick"], "grid": {**history.PRESETS["quick"]["grid"], "seed": [1]}}
    monkeypatch.setitem(history.PRESETS, "quick", changed)
    assert history.closing_record(folder / f"{base}.jsonl", "quick") is None
