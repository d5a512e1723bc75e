"""The main job end to end with tiny models (records made here, not written by hand), every analysis
script on them, the report, and analysis on a subset of results."""
import os
import shutil
import subprocess

import pandas as pd
import pytest
from tests.unit.test_analysis import ROOT


EXPERIMENTS = ["e1_allreduce", "e2_overlap", "e3_bucket_size", "e4_scaling", "e5_skip_sync", "e6_convergence",
               "e7_round_robin"]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """./run_all.sh --profile smoke into a temporary results folder."""
    results = tmp_path_factory.mktemp("results")
    env = {**os.environ, "DDPBENCH_RESULTS": str(results), "DDPBENCH_MACHINE": "test-machine"}
    done = subprocess.run(["./run_all.sh", "--profile", "smoke"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return results, done.stdout


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_smoke_profile_records_every_experiment(smoke):
    results, _ = smoke
    for name in [*EXPERIMENTS, "model_profile", "model_allreduce"]:
        path = results / "runs" / "test-machine" / f"{name}.jsonl"
        assert path.exists() and path.read_text().strip(), f"{name} recorded nothing"
        assert '"status": "failed"' not in path.read_text(), f"{name} has a failed config"


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", EXPERIMENTS)
def test_each_analysis_script_writes_its_figure_and_table(smoke, name):
    results, _ = smoke
    assert (results / "figures" / f"{name}.png").stat().st_size > 10_000
    table = pd.read_csv(results / "tables" / f"{name}.csv")
    assert not table.empty
    if "median" in table:
        assert (table["median"] > 0).all() and (table["q25"] <= table["median"]).all()
        assert (table["median"] <= table["q75"]).all()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_model_is_validated_against_every_measured_run(smoke):
    results, stdout = smoke
    table = pd.read_csv(results / "tables" / "model_validation.csv")
    runs = sum(1 for name in EXPERIMENTS[1:] if name != "e6_convergence"
               for line in (results / "runs" / "test-machine" / f"{name}.jsonl").read_text().splitlines()
               if '"impl": "ddp_core' in line)
    assert len(table) == runs  # every ddp_core run of E2-E7 predicted
    assert (table["predicted_s"] > 0).all() and table["error"].notna().all()
    assert (results / "figures" / "model_validation.png").stat().st_size > 10_000
    assert not pd.read_csv(results / "tables" / "model_allreduce_fit.csv").empty
    assert "model_extrapolation: no profiles of resnet50/bert-base; skipped" in stdout  # tiny models only


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_emulated_part_is_measured_and_reported_beside_loopback(smoke):
    from experiments.emulate.network import check

    problems = check()
    if problems:
        pytest.skip(f"this machine cannot emulate a cluster: {problems}")
    results, _ = smoke
    runs = results / "runs" / "test-machine"
    for name in ("link_fidelity", "link_e2_overlap"):
        text = (runs / f"{name}.jsonl").read_text()
        assert text.strip() and '"status": "failed"' not in text, name
    assert (results / "figures" / "link_emulation.png").stat().st_size > 10_000
    fidelity = pd.read_csv(results / "tables" / "link_fidelity_summary.csv")
    assert list(fidelity["link"]) == ["1gbit"] and fidelity["large_share_min"].between(0.5, 1.1).all()
    overlap = pd.read_csv(results / "tables" / "link_overlap.csv")
    assert {"none", "1gbit"} <= set(overlap["link"])
    assert (overlap["best_possible_pct"] <= 50).all() and overlap["predicted_saving_pct"].notna().all()
    validation = pd.read_csv(results / "tables" / "link_emulation.csv")
    assert len(validation) == 4 and set(validation["link"]) == {"1gbit"}  # 2 models x overlap on/off
    assert validation["error"].notna().all()
    report = (results / "report.md").read_text()
    assert "| 1gbit links |" in report and "| loopback |" in report


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_smoke_report_names_its_folder_and_hardware_and_says_it_checks_plumbing(smoke):
    from experiments.core.machine import environment

    results, _ = smoke
    report = (results / "report.md").read_text()
    assert f"from the records under `{results / 'runs' / 'test-machine'}/`" in report
    assert "re-run `./run_all.sh --profile smoke` to measure again" in report
    assert "results/runs/test-machine" not in report.replace(str(results), "")
    assert f"Hardware: {environment()['cpu']} (" in report  # the whole CPU name, not its first 12 characters
    assert "checks the plumbing" in report and "(smoke: a check of the plumbing, not findings)" in report
    assert "Skipped: no profiles of resnet50/bert-base: the prediction scales" in report
    assert "## Repeats that disagree" in report


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_report_compares_with_the_paper_and_embeds_every_figure(smoke):
    results, stdout = smoke
    report = (results / "report.md").read_text()
    assert "report in" in stdout
    for name in EXPERIMENTS:
        assert f"![{name}](figures/{name}.png)" in report
    for finding in ("E2 overlap cuts latency", "E3 best bucket", "E4 scaling", "E5 reduce every 2", "E6 reduce every",
                    "E7 5 round-robin groups"):
        assert finding in report, finding
    assert any(v in report for v in ("| holds |", "| does not hold |", "| not significant |"))
    # E8 needs both backends; a CPU machine has only Gloo, and the report says so instead of failing.
    assert "E8 - NCCL against Gloo" in report


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_analysis_runs_on_a_subset_of_results(smoke, tmp_path):
    results, _ = smoke
    subset = tmp_path / "runs" / "test-machine"
    subset.mkdir(parents=True)
    shutil.copy(results / "runs" / "test-machine" / "e3_bucket_size.jsonl", subset)
    env = {**os.environ, "DDPBENCH_RESULTS": str(tmp_path), "DDPBENCH_MACHINE": "test-machine"}
    done = subprocess.run(["python", "-m", "analysis.report"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert "no records; skipped" in done.stdout
    report = (tmp_path / "report.md").read_text()
    assert "![e3_bucket_size](figures/e3_bucket_size.png)" in report
    assert report.count("Not measured on this machine.") >= 6
