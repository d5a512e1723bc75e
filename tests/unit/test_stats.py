"""What run and report print and record: no tail quantile from too few samples, the median's interval (its
coverage checked by simulation), launch ratios with stored drift, and the corrections for many tests."""
import numpy as np
import pytest

from experiments.core.stats import benjamini_hochberg, holm, launch_ratio, median_interval, summarize
from experiments.measure.sweep import summary_line


def test_no_p95_from_ten_samples_and_the_median_has_its_interval():
    ten = summarize([0.1 + 0.001 * i for i in range(10)], 8)
    assert ten["p95"] is None and ten["p90"] is None  # run's default of 10 iterations: no tail quantiles
    assert ten["p50_ci"][0] < ten["p50"] < ten["p50_ci"][1]
    forty = summarize([0.1 + 0.001 * i for i in range(40)], 8)
    assert forty["p95"] is not None and forty["p90"] is not None
    line = summary_line({"status": "ok", "config": {"model": "m"}, "summary": ten})
    low, high = ten["p50_ci"]
    assert f"p50 {ten['p50'] * 1e3:.2f} ms [{low * 1e3:.2f}, {high * 1e3:.2f}]" in line, line


@pytest.mark.parametrize("n", [6, 10, 30])
def test_the_median_interval_covers_the_true_median_at_least_95_percent_of_the_time(n):
    rng = np.random.default_rng(n)
    hits = sum(lo <= np.log(2) <= hi for lo, hi in (median_interval(list(rng.exponential(size=n)))
                                                    for _ in range(2000)))
    assert hits / 2000 >= 0.94
    assert median_interval([1.0] * 5) is None


def test_launch_ratio_uses_the_stored_drift_only_where_the_launches_cannot_show_it():
    assert launch_ratio([0.12], [0.10]) is None  # one launch each, nothing stored: no interval at all
    wide = launch_ratio([0.12], [0.10], 0.99, prior_sd=0.10, prior_df=9)
    narrow = launch_ratio([0.12], [0.10], 0.99, prior_sd=0.01, prior_df=9)
    assert wide["ci"][0] < 1 < wide["ci"][1] and narrow["ci"][0] > 1
    assert wide["ratio"] == pytest.approx(1.2) and wide["df"] == 9


def test_holm_and_benjamini_hochberg_adjust_as_published():
    p = [0.01, 0.04, 0.03, 0.005]
    assert holm(p) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert benjamini_hochberg(p) == pytest.approx([0.02, 0.04, 0.04, 0.02])


def test_a_training_record_prints_its_loss_not_milliseconds():
    record = {"kind": "train", "status": "ok", "config": {"model": "m", "sync_every": 2},
              "summary": {"p50": 0.756, "final_loss_mean": 0.7559, "accuracy": 0.81}}
    line = summary_line(record)
    assert "final loss 0.7559" in line and "accuracy 0.810" in line and " ms" not in line, line


def test_report_after_the_smoke_run_alone_points_at_report_smoke(tmp_path):
    from experiments.cli import only_smoke_records

    (tmp_path / "smoke" / "runs" / "m").mkdir(parents=True)
    assert only_smoke_records(tmp_path, "m") == tmp_path / "smoke" / "runs" / "m"
    (tmp_path / "runs" / "m").mkdir(parents=True)
    (tmp_path / "runs" / "m" / "timings.log").write_text("")  # any run's timing log is no main job's record
    assert only_smoke_records(tmp_path, "m") == tmp_path / "smoke" / "runs" / "m"
    (tmp_path / "runs" / "m" / "e1_allreduce.jsonl").write_text("")
    assert only_smoke_records(tmp_path, "m") is None  # the main job's records: report them
