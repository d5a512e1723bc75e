"""`scale-profile --trace`: a trace of the user's loop as a profile record that the scale model replays."""

from experiments.cli import main
from experiments.core.records import read_records
from tests.unit.test_trace_record import traced  # noqa: F401,F811  (fixtures: pytest finds them by name)


def test_the_scale_model_replays_the_traced_compute(traced, tmp_path):
    trace_path, workload, profile = traced
    out = tmp_path / "scale.jsonl"
    assert main(["run", "--model", str(workload), "--batch-size", "8", "--world-size", "2", "--compute", "emulated",
                 "--compute-profile", str(profile), "--iters", "3", "--warmup", "1", "--out", str(out)]) == 0
    record, = read_records(out)
    assert record["status"] == "ok" and record["compute_source"]["file"] == str(profile)
    traced_compute = read_records(profile)[0]["summary"]["p50"]
    assert record["summary"]["p50"] >= 0.9 * traced_compute  # it waited for the traced compute, at least
