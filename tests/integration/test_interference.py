"""The interference term: the probe's record, the term it gives, how the simulation stretches compute that
runs beside an all-reduce, and how predictions use it (or say that they have none)."""
import json

import pytest

from experiments.cli import main
from tests.unit.test_interference import machine  # noqa: F401,F811  (fixtures: pytest finds them by name)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_profile_probes_the_models_interference_with_two_ranks(tmp_path):
    out = tmp_path / "p.jsonl"
    assert main(["profile", "--model", "resnet-tiny", "--image-size", "8", "--batch-size", "2", "--iters", "2",
                 "--warmup", "1", "--out", str(out)]) == 0
    probe = [json.loads(line) for line in out.read_text().splitlines()][-1]
    assert probe["kind"] == "interference" and probe["config"]["world_size"] == 2
    profile = json.loads(out.read_text().splitlines()[0])
    assert probe["bytes"] == sum(profile["bytes"])  # an all-reduce of the model's gradient bytes
    rounds = probe["config"]["rounds"]
    for part in ("backward_alone_s", "allreduce_alone_s", "backward_beside_s", "both_done_s"):
        assert len(probe[part]) == rounds and all(t > 0 for t in probe[part])
    assert all(done >= beside for done, beside in zip(probe["both_done_s"], probe["backward_beside_s"]))
    # on shared cores, DDP's own overlap: with and without, and the buckets launched beside backward
    assert len(probe["ddp_overlap_s"]) == len(probe["ddp_no_overlap_s"]) == rounds
    assert all(0 < launched < probe["bytes"] for launched in probe["launched_beside_bytes"])
    assert probe["timing"]["other_cores_busy"] is not None and "seconds_per_byte" in probe["summary"]
    assert main(["profile", "--model", "resnet-tiny", "--interference-probe", "maybe", "--out", str(out)]) == 2


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_advise_on_this_machine_probes_interference_and_uses_it(machine, tmp_path, capsys):
    out = tmp_path / "advice" / "tiny"
    argv = ["advise", "--model", "resnet-tiny", "--image-size", "8", "--batch-size", "2", "--iters", "2", "--warmup",
            "1", "--world-size", "2", "--allreduce", str(machine)]
    assert main([*argv, "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "interference: " in text and "probe of resnet-tiny on cpu (gloo), 2 rank(s)" in text
    kinds = [json.loads(line)["kind"] for line in out.with_name("tiny.profile.jsonl").read_text().splitlines()]
    assert kinds == ["profile", "interference"]
    report = json.loads(out.with_name("tiny.json").read_text())
    assert "probe of resnet-tiny" in report["interference"]
    # reported again from the stored profile: the same probe, from the same file
    assert main(["advise", "--model", "resnet-tiny", "--world-size", "2", "--allreduce", str(machine),
                 "--from-profile", str(out.with_name("tiny.profile.jsonl"))]) == 0
    assert "probe of resnet-tiny on cpu (gloo)" in capsys.readouterr().out
    # for a GPU cluster this CPU's probe does not apply, and advise says so
    assert main([*argv[:-2], "--cluster", "paper-v100-nccl", "--compute-s", "0.05", "--from-profile",
                 str(out.with_name("tiny.profile.jsonl"))]) == 0
    assert "interference: none modelled (the probe measures this machine, not paper-v100-nccl's GPUs)" in \
        capsys.readouterr().out
