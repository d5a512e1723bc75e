"""`run --bucket-mb auto`: ddp_core chooses its cap in iterations counted apart, the record says what it
chose and why, and the options that cannot choose a cap are refused before any rank starts."""
import json

import pytest

from ddp_core import auto_bucket
from experiments.cli import main
from experiments.measure.sweep import summary_line


TINY = ["--model", "resnet-tiny", "--image-size", "16", "--batch-size", "2", "--iters", "4", "--warmup", "1"]


@pytest.mark.timeout(240)
def test_auto_tunes_apart_from_the_measured_iterations_and_records_its_choice(tmp_path, capsys):
    out = tmp_path / "records.jsonl"
    assert main(["run", *TINY, "--impl", "ddp_core", "--bucket-mb", "auto", "--out", str(out)]) == 0
    record = json.loads(out.read_text().splitlines()[0])
    assert record["config"]["bucket_mb"] == "auto" and record["status"] == "ok" and record["correct"]
    auto = record["auto_bucket"]
    # the tuner's iterations: up to and including the one whose forward chose (after round 1, 2 or 3 of the
    # measured search over three layouts), none of them measured
    chosen_at = auto["auto_bucket_decided_after_iterations"] + 1
    assert chosen_at - auto_bucket.DECIDE_AT in auto_bucket.SEARCH_STOPS
    assert auto["tuning_iterations"] == chosen_at == len(auto["tuning_latency_s"]) <= auto_bucket.BUDGET
    assert all(t > 0 for t in auto["tuning_latency_s"])
    assert len(record["latency_s"]) == 4  # the config's own iterations, all on the chosen buckets
    assert auto["auto_bucket_state"] == "chosen" and auto["auto_bucket_cap_mb"] > 0
    chosen = f"{auto['auto_bucket_cap_mb']:g}/{auto['auto_first_bucket_cap_mb']:g} MB"
    assert chosen in auto["auto_bucket_predictions"] and chosen in auto["auto_bucket_measured"]
    assert chosen in auto["auto_bucket_reason"] and len(auto["auto_bucket_measured"].split("; ")) == 3
    line = summary_line(record)
    assert f"auto cap {auto['auto_bucket_cap_mb']:.3g} MB" in line and f"in {chosen_at} iterations" in line
    assert line in capsys.readouterr().out
