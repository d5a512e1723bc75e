"""The main job end to end with tiny models (records made here, not written by hand), every analysis
script on them, the report, and analysis on a subset of results."""
import os
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
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


@pytest.mark.timeout(900)
def test_smoke_profile_records_every_experiment(smoke):
    results, _ = smoke
    for name in [*EXPERIMENTS, "model_profile", "model_allreduce"]:
        path = results / "runs" / "test-machine" / f"{name}.jsonl"
        assert path.exists() and path.read_text().strip(), f"{name} recorded nothing"
        assert '"status": "failed"' not in path.read_text(), f"{name} has a failed config"


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


def test_repeats_of_one_config_that_disagree_are_listed():
    import dataclasses

    from analysis.report import disagreeing_repeats
    from experiments.core.config import RunConfig

    def frame(*rows):
        return pd.DataFrame([{**dataclasses.asdict(RunConfig(**{"impl": "ddp_core", **config})), "latency_s": samples}
                             for config, samples in rows])

    fast, slow, noisy = [0.057, 0.058, 0.059, 0.058], [0.145, 0.146, 0.147, 0.146], [0.03, 0.05, 0.1, 0.2]
    table = disagreeing_repeats({
        "e2_overlap": frame(({}, fast), ({"model": "bert-tiny"}, fast)),
        "e3_bucket_size": frame(({"iters": 4}, slow), ({"model": "bert-tiny"}, noisy)),
        "e4_scaling": frame(({"world_size": 1}, slow)),
    })
    assert list(table["config"]) == ["resnet-tiny, 2 ranks, 25 MB, ddp_core"]  # bert-tiny overlaps; ws 1 once
    assert table["slowest/fastest"].item() == pytest.approx(146 / 58)
    assert "e2_overlap 58.0 [57.8-58.2]; e3_bucket_size 146.0" in table["repeats (median ms [IQR])"].item()
    assert disagreeing_repeats({"e2_overlap": pd.DataFrame()}).empty


def test_compile_overlap_places_the_first_bucket_launch_within_backward():
    from analysis.compile_overlap import first_launch_in_backward, row

    # rank 0: backward from 0.1 to 0.3 s, first launch at 0.15 s (a quarter in); rank 1: 0.15 to 0.35 s,
    # launch at 0.35 s (at its end): the median of 0.25 and 1.0
    record = {"config": {"impl": "ddp_core", "compile": "default", "model": "m", "bucket_mb": 5.0},
              "latency_s": [0.5, 0.6], "buckets": [{"0": [0.25, 0.4], "1": [0.15, 0.2]}, {"0": [0.35, 0.4]}],
              "phases_s": {"forward": [[0.1, 0.1], [0.1, 0.15]], "backward": [[0.2, 0.2], [0.2, 0.2]],
                           "exposed_comm": [[0.05, None], [0.0, 0.0]]}}
    assert first_launch_in_backward(record) == pytest.approx(0.625)
    assert row(record)["buckets"] == 2 and row(record)["exposed_comm_s"] == 0.05
    assert first_launch_in_backward({**record, "buckets": [None, None]}) is None  # PyTorch's DDP: no timeline


def test_caption_keeps_the_whole_cpu_name_and_shortens_only_the_commit():
    from analysis.common import caption

    frame = pd.DataFrame({"env_cpu": ["Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz"], "env_cpu_count": [2],
                          "env_torch": ["2.5.1+cpu"], "env_git_commit": ["c1aa1c2" + "0" * 33]})
    assert caption(frame) == "Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz (2 cores); torch 2.5.1+cpu; commit c1aa1c200000"


def test_a_log_axis_is_labelled_plainly_at_the_measured_values():
    from analysis.common import figure, plain_ticks

    fig, (ax,) = figure("caption")
    ax.plot([1, 2, 4, 8], [4, 3, 2, 1])
    ax.set_xscale("log")
    plain_ticks(ax, [1, 2, 4, 8])
    fig.canvas.draw()
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "2", "4", "8"]
    assert not [t.get_text() for t in ax.get_xticklabels(minor=True) if t.get_text()]  # no 3x10^0 beside 4x10^0


def test_extrapolation_predicts_every_experiment_point():
    from analysis.model_extrapolation import CAPS, WORLD_SIZES, predictions
    from tests.test_perfmodel import MB, toy_profile

    table = predictions({"resnet50": toy_profile(nbytes=(100 * MB, 100 * MB))})
    assert len(table) == 2 * (len(WORLD_SIZES) + len(CAPS) + 4 + 3)  # both backends
    e4 = table[(table["experiment"] == "E4") & (table["backend"] == "NCCL")].sort_values("world_size")
    assert e4["predicted_s"].is_monotonic_increasing  # more GPUs, never faster per iteration
    gloo, nccl = (table[(table["experiment"] == "E4") & (table["backend"] == b) & (table["world_size"] == 256)]
                  ["predicted_s"].item() for b in ("Gloo", "NCCL"))
    assert gloo > nccl


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


def test_run_all_help_prints_its_usage_only():
    done = subprocess.run(["./run_all.sh", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.startswith("The main job:")
    assert "./run_all.sh [--profile smoke|quick|full]" in done.stdout
    assert "set -euo" not in done.stdout and "#" not in done.stdout


def test_analysis_scripts_are_jupytext_percent_notebooks():
    for script in sorted((ROOT / "analysis").glob("e*.py")) + [ROOT / "analysis" / "report.py"]:
        text = script.read_text()
        assert text.startswith("# %% [markdown]") and "\n# %%\n" in text, script.name
