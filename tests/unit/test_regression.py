"""Regression testing: compare's verdicts (pooled and paired by round) and exit codes, A/B and history of
real revisions in a throwaway repo."""
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from experiments.cli import main
from experiments.core.records import append_record, read_records
from experiments.regression.compare import compare

ROOT = Path(__file__).resolve().parents[2]


MACHINE = {"machine": "test-machine", "machine_id": "0123456789"}


def write_runs(path: Path, medians: dict[float, float], n: int = 40, noise: float = 0.02, seed: int = 0,
               tag: dict | None = None, launches: int = 1, launch_sd: float = 0.0, extra: dict | None = None) -> None:
    """Records whose latency samples are drawn around the given medians (one config per bucket cap), each
    config in `launches` records (separate launches), each launch's median off by a factor of sd `launch_sd`."""
    rng = np.random.default_rng(seed)
    for bucket_mb, median in medians.items():
        config = {"model": "resnet-tiny", "impl": "ddp_core", "backend": "gloo", "device": "cpu", "world_size": 2,
                  "bucket_mb": bucket_mb, "sync_every": 1, "process_groups": 1, "comm_hook": "none"}
        for _ in range(launches):
            launch = median * float(np.exp(launch_sd * rng.standard_normal()))
            samples = (launch * (1 + noise * rng.standard_normal(n))).tolist()
            append_record(path, {"kind": "run", "status": "ok", "config": config, "latency_s": samples,
                                 "env": dict(MACHINE), **({"round": tag} if tag else {}), **(extra or {})})


def write_drift(path: Path, sd: float, launches: int = 12, seed: int = 9) -> None:
    """A drift file of this test's machine: `launches` launches of one config in one session, their medians
    spread with sd `sd` (what `ddpbench drift` writes)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    factors = np.exp(sd * rng.standard_normal(launches))
    factors = np.exp((np.log(factors) - np.log(factors).mean()) / np.log(factors).std(ddof=1) * sd)  # exactly sd
    for i, factor in enumerate(factors):
        write_runs(path, {25.0: 0.05 * factor}, seed=100 + i, extra={"drift": {"session": "s1", "launch": i}})


def test_compare_flags_a_real_slowdown_and_nothing_else(tmp_path, capsys):
    # Four launches per side, whose medians stray by 3% from launch to launch: the interval comes from them.
    base, new = tmp_path / "base.jsonl", tmp_path / "new.jsonl"
    write_runs(base, {1.0: 0.100, 5.0: 0.100, 25.0: 0.100, 50.0: 0.100}, seed=1, launches=4, launch_sd=0.03)
    write_runs(new, {1.0: 0.125, 5.0: 0.100, 25.0: 0.080, 50.0: 0.1045}, seed=2, launches=4, launch_sd=0.03)
    assert main(["compare", str(base), str(new), "--json"]) == 1
    rows = {row["config"]["bucket_mb"]: row for row in json.loads(capsys.readouterr().out)}
    assert {row["method"] for row in rows.values()} == {"launches 4x4"}
    assert rows[1.0]["verdict"] == "slower" and rows[1.0]["ratio"] == pytest.approx(1.25, abs=0.06)
    assert rows[5.0]["verdict"] in ("unchanged", "not significant")
    assert rows[25.0]["verdict"] == "faster"
    assert rows[50.0]["verdict"] in ("not significant", "unchanged")  # +4.5%: below the 5% threshold
    assert main(["compare", str(base), str(base)]) == 0
    table = capsys.readouterr().out
    assert "before" in table and "ratio" in table and "Holm" in table


def test_one_launch_each_is_judged_against_the_machines_launch_to_launch_drift(tmp_path, capsys, monkeypatch):
    # Two launches of identical code on a busy machine: 19% apart, each launch's iterations tight (2%). Pooling
    # iterations called this slower (interval [1.15, 1.23], all beyond 5%); the launch is the unit, and this
    # machine's launches stray by 8%, so one launch each cannot tell.
    monkeypatch.setenv("DDPBENCH_RESULTS", str(tmp_path / "results"))
    base, same, hog = tmp_path / "base.jsonl", tmp_path / "same.jsonl", tmp_path / "hog.jsonl"
    write_runs(base, {25.0: 0.100}, seed=1)
    write_runs(same, {25.0: 0.119}, seed=2)
    write_runs(hog, {25.0: 0.190}, seed=3)  # beside a CPU hog: 1.9x
    assert main(["compare", str(base), str(same)]) == 0  # no drift measured: cannot tell, says why
    assert "drift is not measured" in capsys.readouterr().out
    drift = tmp_path / "results" / "runs" / MACHINE["machine"] / "drift.jsonl"
    write_drift(drift, sd=0.08)
    assert main(["compare", str(base), str(same), "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert row["verdict"] == "not significant" and row["method"] == "launches 1x1 +drift", row
    assert re.search(r"drift of [78]\.\d%", row["reason"]) and str(drift) in row["reason"], row["reason"]
    assert main(["compare", str(base), str(hog), "--json"]) == 1
    [row] = json.loads(capsys.readouterr().out)
    assert row["verdict"] == "slower" and row["ci"][0] > 1.05, row
    # A drift file named on the command line is used instead; one that holds no session is bad input.
    quiet = tmp_path / "quiet.jsonl"
    write_drift(quiet, sd=0.01)
    assert main(["compare", str(base), str(same), "--drift", str(quiet)]) == 1
    capsys.readouterr()
    assert main(["compare", str(base), str(same), "--drift", str(base)]) == 2
    assert "no drift session" in capsys.readouterr().err
    # Records of another machine do not use this one's drift.
    other = tmp_path / "other.jsonl"
    write_runs(other, {25.0: 0.119}, seed=2, extra={"env": {"machine": "elsewhere", "machine_id": "x"}})
    assert compare(base, other)[0]["reason"].startswith("one launch each, and this machine's launch-to-launch")


def test_many_configs_are_corrected_for_multiple_comparisons_by_holm(tmp_path):
    # 30 configs of identical code, 3 launches a side: at 95% about 1.5 of them would look significant by chance.
    # With Holm's correction over the 30, the family's chance of any false alarm is held at 5%.
    base, new = tmp_path / "base.jsonl", tmp_path / "new.jsonl"
    caps = {float(b): 0.1 for b in range(1, 31)}
    write_runs(base, caps, seed=11, launches=3, launch_sd=0.05)
    write_runs(new, caps, seed=111, launches=3, launch_sd=0.05)
    rows = compare(base, new, threshold=0.0001, confidence=0.95)
    raw = [row for row in rows if row["p"] < 0.05]
    assert all(row["p_holm"] >= row["p"] for row in rows)
    assert not any(row["verdict"] in ("slower", "faster") for row in rows), [r for r in rows if r["p_holm"] < .05]
    assert len(raw) >= 2  # (these seeds: 3 configs below p 0.05 before the correction)


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
    assert main(["compare", str(base), str(base), "--drift", str(tmp_path / "none.jsonl")]) == 2
    assert "--drift=" in capsys.readouterr().err


def test_paired_rounds_flag_a_10_percent_slowdown_that_drift_hides_from_unpaired_launches(tmp_path):
    # Six A/B rounds; the machine drifts by up to 30% between rounds, alike for A and B within a round.
    drift = [1.0, 1.3, 0.75, 1.2, 0.85, 1.1]
    for name, slowdown in (("same", 1.0), ("slow", 1.10)):
        for index, d in enumerate(drift):
            tag = {"session": "s", "index": index}
            write_runs(tmp_path / f"base-{name}.jsonl", {1.0: 0.1 * d}, noise=0.05, seed=2 * index, tag=tag)
            write_runs(tmp_path / f"new-{name}.jsonl", {1.0: 0.1 * d * slowdown}, noise=0.05, seed=2 * index + 1,
                       tag=tag)
    [slow] = compare(tmp_path / "base-slow.jsonl", tmp_path / "new-slow.jsonl")
    assert slow["method"] == "paired x6" and slow["verdict"] == "slower", slow
    assert slow["ratio"] == pytest.approx(1.10, abs=0.02)
    [same] = compare(tmp_path / "base-same.jsonl", tmp_path / "new-same.jsonl")
    assert same["verdict"] == "unchanged", same
    # The same records without their rounds: six launches a side, unpaired; the drift widens the interval.
    untagged = [[{k: v for k, v in r.items() if k != "round"} for r in read_records(tmp_path / f"{side}-slow.jsonl")]
                for side in ("base", "new")]
    [unpaired] = compare(*untagged)
    assert unpaired["method"] == "launches 6x6" and unpaired["verdict"] == "not significant", unpaired
    assert unpaired["ci"][1] - unpaired["ci"][0] > 2 * (slow["ci"][1] - slow["ci"][0]), (unpaired, slow)
    # Rounds of different sessions were not run back to back: never paired.
    other = tmp_path / "other-session.jsonl"
    for index in range(6):
        write_runs(other, {1.0: 0.1}, seed=index, tag={"session": "t", "index": index})
    assert compare(tmp_path / "base-slow.jsonl", other)[0]["method"] == "launches 6x6"


def _scratch_repo(tmp_path: Path) -> Path:
    """A git repository holding this project's files (as in the working tree, new ones included), committed once."""
    repo = tmp_path / "repo"
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
    for name in files:
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        if (ROOT / name).is_file():
            shutil.copy2(ROOT / name, repo / name)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-qm", "base"], cwd=repo, check=True)
    return repo


def test_interleaved_loads_each_trees_ddp_core_as_a_package_of_its_own(tmp_path):
    from experiments.regression import interleaved

    for name in ("a", "b"):
        shutil.copytree(ROOT / "ddp_core", tmp_path / name / "ddp_core", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "b" / "ddp_core" / "reducer.py").write_text(
        (tmp_path / "b" / "ddp_core" / "reducer.py").read_text() + "\nMARKED = True\n")
    a = interleaved.load_ddp_core(tmp_path / "a", "ddp_core_test_a")
    b = interleaved.load_ddp_core(tmp_path / "b", "ddp_core_test_b")
    try:
        assert a.DistributedDataParallel is not b.DistributedDataParallel
        assert sys.modules["ddp_core_test_b.reducer"].MARKED and not hasattr(sys.modules["ddp_core_test_a.reducer"],
                                                                               "MARKED")
        assert a.reducer.__file__.startswith(str(tmp_path / "a"))  # its relative imports stayed inside it
        assert interleaved.load_ddp_core(tmp_path / "a", "ddp_core_test_a") is a
        with pytest.raises(ImportError, match="already imported from"):
            interleaved.load_ddp_core(tmp_path / "b", "ddp_core_test_a")
    finally:
        for name in [n for n in sys.modules if n.startswith("ddp_core_test_")]:
            del sys.modules[name]


def test_history_bad_revisions_exit_2_with_the_reason(tmp_path, capsys):
    repo = _scratch_repo(tmp_path)
    for revisions, message in ((["nosuch..HEAD"], "revision range 'nosuch..HEAD' is not valid"),
                               (["HEAD..HEAD"], "revision range 'HEAD..HEAD' selects no commits"),
                               (["nosuch"], "revision 'nosuch' is not a commit")):
        assert main(["history", *revisions, "--repo", str(repo), "--results", str(tmp_path / "r")]) == 2
        assert message in capsys.readouterr().err
    assert main(["history", "HEAD", "--rounds", "0", "--repo", str(repo)]) == 2
    assert "--rounds=0 is not allowed" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()
