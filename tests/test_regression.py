"""Regression testing: compare's verdicts and exit codes, and A/B of real revisions in a throwaway repo."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from experiments.cli import main
from experiments.records import append_record

ROOT = Path(__file__).resolve().parents[1]


def write_runs(path: Path, medians: dict[float, float], n: int = 40, noise: float = 0.02, seed: int = 0) -> None:
    """Records whose latency samples are drawn around the given medians (one config per bucket cap)."""
    rng = np.random.default_rng(seed)
    for bucket_mb, median in medians.items():
        config = {"model": "resnet-tiny", "impl": "ddp_core", "backend": "gloo", "device": "cpu", "world_size": 2,
                  "bucket_mb": bucket_mb, "sync_every": 1, "process_groups": 1, "comm_hook": "none"}
        samples = (median * (1 + noise * rng.standard_normal(n))).tolist()
        append_record(path, {"kind": "run", "status": "ok", "config": config, "latency_s": samples})


def test_compare_flags_a_real_slowdown_and_nothing_else(tmp_path, capsys):
    base, new = tmp_path / "base.jsonl", tmp_path / "new.jsonl"
    write_runs(base, {1.0: 0.100, 5.0: 0.100, 25.0: 0.100, 50.0: 0.100}, seed=1)
    write_runs(new, {1.0: 0.115, 5.0: 0.100, 25.0: 0.085, 50.0: 0.1045}, seed=2)
    assert main(["compare", str(base), str(new), "--json"]) == 1
    rows = {row["config"]["bucket_mb"]: row for row in json.loads(capsys.readouterr().out)}
    assert rows[1.0]["verdict"] == "slower" and rows[1.0]["ratio"] == pytest.approx(1.15, abs=0.02)
    assert rows[5.0]["verdict"] == "unchanged"
    assert rows[25.0]["verdict"] == "faster"
    assert rows[50.0]["verdict"] in ("not significant", "unchanged")  # +4.5%: below the 5% threshold
    assert main(["compare", str(base), str(base)]) == 0
    table = capsys.readouterr().out
    assert "before" in table and "ratio" in table


def test_compare_bad_input_exits_2_with_the_reason(tmp_path, capsys):
    base, other = tmp_path / "base.jsonl", tmp_path / "other.jsonl"
    write_runs(base, {1.0: 0.1})
    write_runs(other, {2.0: 0.1})
    assert main(["compare", str(base), str(tmp_path / "missing.jsonl")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["compare", str(base), str(other)]) == 2
    assert "no successful run configs in common" in capsys.readouterr().err
    old = tmp_path / "old.jsonl"
    old.write_text(json.dumps({"schema_version": 0, "kind": "run"}) + "\n")
    assert main(["compare", str(base), str(old)]) == 2
    assert "schema_version 0" in capsys.readouterr().err
    assert main(["compare", str(base), str(base), "--threshold", "2"]) == 2
    assert "--threshold=2.0 is not allowed" in capsys.readouterr().err


def _scratch_repo(tmp_path: Path) -> Path:
    """A git repository holding this project's tracked files, committed once."""
    repo = tmp_path / "repo"
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    for name in files:
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        if (ROOT / name).is_file():
            shutil.copy2(ROOT / name, repo / name)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-qm", "base"], cwd=repo, check=True)
    return repo


def _ab(repo: Path, base: str, head: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "experiments", "ab", base, head, "--preset", "smoke",
                           "--rounds", "2", "--repo", str(repo)],
                          cwd=repo, capture_output=True, text=True, timeout=600)


@pytest.mark.timeout(900)
def test_ab_stays_quiet_on_identical_code_and_flags_a_slowed_commit(tmp_path):
    repo = _scratch_repo(tmp_path)
    same = _ab(repo, "HEAD", "HEAD")
    assert same.returncode == 0, same.stdout + same.stderr
    # A throwaway commit that slows the measured path: 20 ms in the backward pass of every iteration.
    reducer = repo / "ddp_core" / "reducer.py"
    text = reducer.read_text()
    text = text.replace("    def _finish_backward(self) -> None:\n",
                        "    def _finish_backward(self) -> None:\n        __import__('time').sleep(0.02)\n", 1)
    reducer.write_text(text)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "slow"], cwd=repo,
                   check=True)
    slowed = _ab(repo, "HEAD~1", "HEAD")
    assert slowed.returncode == 1, slowed.stdout + slowed.stderr
    assert "+" in slowed.stdout.split("ratio", 1)[1]
