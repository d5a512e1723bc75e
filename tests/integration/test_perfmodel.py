"""The performance model: the all-reduce fit, the schedule simulation on hand-made profiles whose answer
is known, and `ddpbench profile | predict | tune-bucket` end to end on a tiny model."""
import json

import pytest

from experiments.cli import main
from experiments.core.profile import find_profile
from experiments.perfmodel.comm import fit
from tests.unit.test_perfmodel import allreduce_record


@pytest.fixture(scope="module")
def tiny_profile(tmp_path_factory):
    out = tmp_path_factory.mktemp("profile") / "profile.jsonl"
    status = main(["profile", "--model", "resnet-tiny", "--image-size", "16", "--batch-size", "2", "--iters", "3",
                   "--warmup", "1", "--colocated", "1,2", "--out", str(out)])
    assert status == 0
    return out


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_profile_records_every_gradient_in_arrival_order(tiny_profile):
    records = [json.loads(line) for line in tiny_profile.read_text().splitlines()]
    alone, colocated = [r for r in records if r["kind"] == "profile"]
    assert [r["kind"] for r in records] == ["profile", "profile", "interference"]  # then the model's probe
    assert alone["config"]["world_size"] == 1 and alone["other_copies"] == []
    # two copies at once: the slowest one's samples, both copies' medians, the other's raw samples
    assert colocated["config"]["world_size"] == 2 and len(colocated["other_copies"]) == 1
    assert colocated["summary"]["p50"] == max(colocated["summary"]["copies_p50"])
    for record in (alone, colocated):
        assert len(record["names"]) == len(record["bytes"]) == 38 and len(record["synced"]) == 3
        for row in record["synced"]:
            assert all(0 < t <= row["backward"] for t in row["ready"])
            # backward runs from the loss to the input: the classifier's gradient comes before the first conv's
            assert row["ready"][record["names"].index("fc.weight")] < row["ready"][record["names"].index("conv1.weight")]


@pytest.mark.slow
def test_a_run_uses_the_profile_colocated_as_its_ranks_else_the_one_process_profile(tiny_profile):
    records = [json.loads(line) for line in tiny_profile.read_text().splitlines()]
    config = {**records[0]["config"], "world_size": 2}
    assert find_profile(records, config).config["world_size"] == 2
    assert find_profile(records, {**config, "world_size": 3}).config["world_size"] == 1
    assert find_profile(records[1:], {**config, "world_size": 1}) is None
    assert find_profile(records, {**config, "batch_size": 3}) is None


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_predict_and_tune_bucket_print_json(tiny_profile, capsys):
    assert main(["predict", "--profile", str(tiny_profile), "--model", "resnet-tiny", "--cluster", "paper-v100-nccl",
                 "--world-size", "8,64", "--overlap", "on,off", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["predictions"]
    assert len(rows) == 4
    assert all(row["latency_ms"] > 0 for row in rows)
    assert main(["tune-bucket", "--profile", str(tiny_profile), "--model", "resnet-tiny", "--cluster",
                 "paper-v100-gloo", "--world-size", "32", "--colocated", "2", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["profile"]["world_size"] == 2
    assert result["recommended_bucket_mb"] in [row["bucket_mb"] for row in result["predictions"]]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_predict_says_which_profile_and_warns_of_a_cpu_profile_for_a_gpu_cluster(tiny_profile, capsys):
    argv = ["predict", "--profile", str(tiny_profile), "--model", "resnet-tiny", "--cluster", "paper-v100-nccl"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert (f"profile: resnet-tiny on cpu, batch 2, image size 16, sequence length 32, 1 thread(s), measured alone "
            f"(1 copy); from {tiny_profile}") in out
    assert "warning: a CPU profile used for the GPU cluster --cluster=paper-v100-nccl" in err
    assert main([*argv, "--compute-s", "0.05"]) == 0
    out, err = capsys.readouterr()
    assert "scaled to 0.05 s of compute per iteration" in out and "warning" not in err
    assert main(["tune-bucket", *argv[1:], "--compute-s", "0.05", "--world-size", "32"]) == 0
    assert "recommended --bucket-mb" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.parametrize("argv, needle", [
    (["--model", "resnet-tiny", "--cluster", "dgx-a100"], "--cluster='dgx-a100' is unknown; choose one of paper-v100"),
    (["--model", "bert-base", "--cluster", "paper-v100-nccl"], "holds no profile of --model='bert-base'"),
    (["--model", "resnet-tiny", "--cluster", "paper-v100-nccl", "--colocated", "3"], "with --colocated=3; it has: "
     "resnet-tiny (colocated 1), resnet-tiny (colocated 2); add --colocated with one of 1, 2"),
    (["--model", "resnet-tiny", "--cluster", "paper-v100-nccl", "--bucket-mb", "-5"], "--bucket-mb=-5 is not allowed"),
    (["--model", "resnet-tiny", "--cluster", "paper-v100-nccl", "--overlap", "maybe"], "--overlap: 'maybe' is not"),
    (["--model", "resnet-tiny", "--allreduce", "/nonexistent"], "--allreduce='/nonexistent': no record file"),
])
def test_predict_bad_input_exits_2_with_the_reason(tiny_profile, capsys, argv, needle):
    assert main(["predict", "--profile", str(tiny_profile), *argv]) == 2
    assert needle in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_predict_takes_the_only_profile_there_is_and_names_the_flag_that_picks_one(tiny_profile, tmp_path, capsys):
    # `advise` profiles as many copies as ranks: its file holds one profile, of 2 co-located copies.
    only_two = tmp_path / "advise.profile.jsonl"
    only_two.write_text(tiny_profile.read_text().splitlines()[1] + "\n")
    argv = ["predict", "--profile", str(only_two), "--model", "resnet-tiny", "--cluster", "paper-v100-nccl", "--json"]
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["profile"]["world_size"] == 2
    assert main([*argv, "--colocated", "1"]) == 2
    assert "add --colocated 2" in capsys.readouterr().err


def _fitted_allreduce(path, ranks=2):
    """All-reduce records of one world size (a fit's input), 1 KiB to 4 MiB per call."""
    from experiments.core.records import append_record

    for elements in (256, 4096, 65536, 1 << 20):
        append_record(path, allreduce_record("size", elements, elements, ranks, 1e-4 + elements * 4 / 1e9))


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_predictions_carry_intervals_from_the_models_validation_errors_and_name_extrapolation(tiny_profile, tmp_path,
                                                                                               capsys):
    from experiments.perfmodel.uncertainty import model_error

    allreduce = tmp_path / "allreduce.jsonl"
    _fitted_allreduce(allreduce)
    argv = ["predict", "--profile", str(tiny_profile), "--model", "resnet-tiny", "--allreduce", str(allreduce),
            "--world-size", "2,8", "--bucket-mb", "25"]
    assert main([*argv, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    error = model_error(fit([json.loads(line) for line in allreduce.read_text().splitlines()], "gloo", "cpu").model)
    for row in result["predictions"]:
        low, high = row["interval_ms"]
        assert low < row["latency_ms"] < high  # the errors run both ways
        assert (low, high) == pytest.approx([x * 1e3 for x in error.interval(row["latency_ms"] / 1e3)])
    assert any("world size 8 is extrapolated: the all-reduce was measured at 2" in c for c in result["caveats"])
    # 18.7 MB of resnet-tiny's gradients in one 25 MB bucket: beyond the 4 MiB the fit measured
    assert any("MiB is extrapolated" in c for c in result["caveats"])
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "90% of runs within" in text and "median |error|" in text
    # a cluster preset was never validated: no interval, and it says so
    assert main(["predict", "--profile", str(tiny_profile), "--model", "resnet-tiny", "--cluster", "paper-v100-nccl",
                 "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert all(row["interval_ms"] is None for row in result["predictions"])
    assert "never validated" in result["caveats"][0]
