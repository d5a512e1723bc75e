"""The main job end to end with tiny models (records made here, not written by hand), every analysis
script on them, the report, and analysis on a subset of results."""
import subprocess
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]


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
    from tests.unit.test_perfmodel import MB, toy_profile

    table = predictions({"resnet50": toy_profile(nbytes=(100 * MB, 100 * MB))})
    assert len(table) == 2 * (len(WORLD_SIZES) + len(CAPS) + 4 + 3)  # both backends
    e4 = table[(table["experiment"] == "E4") & (table["backend"] == "NCCL")].sort_values("world_size")
    assert e4["predicted_s"].is_monotonic_increasing  # more GPUs, never faster per iteration
    gloo, nccl = (table[(table["experiment"] == "E4") & (table["backend"] == b) & (table["world_size"] == 256)]
                  ["predicted_s"].item() for b in ("Gloo", "NCCL"))
    assert gloo > nccl


def test_run_all_help_prints_its_usage_only():
    done = subprocess.run(["./run_all.sh", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.startswith("The main job:")
    assert "./run_all.sh [--profile smoke|quick|full]" in done.stdout
    assert "set -euo" not in done.stdout and "#" not in done.stdout


def test_analysis_scripts_are_jupytext_percent_notebooks():
    for script in sorted((ROOT / "analysis").glob("e*.py")) + [ROOT / "analysis" / "report.py"]:
        text = script.read_text()
        assert text.startswith("# %% [markdown]") and "\n# %%\n" in text, script.name
