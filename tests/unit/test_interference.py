"""The interference term: the probe's record, the term it gives, how the simulation stretches compute that
runs beside an all-reduce, and how predictions use it (or say that they have none)."""
import dataclasses
import json

import pytest

from experiments.cli import main
from experiments.core.records import SCHEMA_VERSION
from experiments.perfmodel.comm import CommModel, Interference, Link, emulated
from experiments.perfmodel.interference import from_record, per_round, pick
from experiments.perfmodel.predict import comm_model
from experiments.perfmodel.simulate import Schedule, simulate
from experiments.perfmodel.validation import prediction_errors

MB = 1024 * 1024
from tests.unit.test_devices import profile_record# noqa: E402  (a hand-made profile record)
from tests.unit.test_perfmodel import TOY_NET, allreduce_record, toy_profile# noqa: E402


def probe_record(model="resnet50", device="cpu", backend="gloo", alone=(1.0,) * 3, reduce=(0.5,) * 3,
                 beside=(1.2,) * 3, done=(1.7,) * 3, nbytes=100 * MB, time="2024-01-01T00:00:00Z", ddp=None):
    """An interference record as the probe writes one, with the times given (seconds, per round); `ddp`:
    (overlap, no overlap, bytes launched beside backward) per round, as a CPU probe measures DDP's own."""
    config = {"model": model, "backend": backend, "device": device, "world_size": 2, "threads": 1, "batch_size": 2,
              "image_size": 32, "seq_len": 16, "model_config": "", "amp": "none", "model_hash": "", "rounds": 3,
              "warmup": 1, "seed": 0, "link": "none", "ranks_per_host": 1}
    return {"kind": "interference", "status": "ok", "config": config, "bytes": nbytes, "backward_alone_s": list(alone),
            "allreduce_alone_s": list(reduce), "backward_beside_s": list(beside), "both_done_s": list(done),
            "timing": {"other_cores_busy": 0.1}, "env": {"time": time},
            **({} if ddp is None else {"ddp_overlap_s": [r[0] for r in ddp], "ddp_no_overlap_s": [r[1] for r in ddp],
                                       "launched_beside_bytes": [r[2] for r in ddp]})}


def test_on_shared_cores_the_term_is_what_ddps_overlap_costs_per_byte_launched_beside_backward():
    # overlap 1.3 s, no overlap 1.2 s, 80 MB launched beside backward: 0.1 s per 80 MB (the median round)
    rounds = [(1.3, 1.2, 80 * MB), (1.5, 1.2, 80 * MB), (1.25, 1.2, 80 * MB)]
    term = from_record(probe_record(ddp=rounds))
    assert term.seconds_per_byte == pytest.approx(0.1 / (80 * MB))
    assert per_round(probe_record(ddp=rounds)) == pytest.approx([0.1 / (80 * MB), 0.3 / (80 * MB), 0.05 / (80 * MB)])
    # overlap cheaper than none: measured negative, not modelled
    assert from_record(probe_record(ddp=[(1.1, 1.2, 80 * MB)] * 3)).seconds_per_byte == 0


def test_on_shared_cores_the_term_is_what_side_by_side_costs_beyond_one_after_the_other():
    # backward 1.0 s, all-reduce 0.5 s alone; side by side both end at 1.7 s: 0.2 s more than 1.5 s
    term = from_record(probe_record())
    assert term.seconds_per_byte == pytest.approx(0.2 / (100 * MB))
    assert term.slowdown == pytest.approx(0.2)
    # side by side cheaper than one after the other (the cores idle while Gloo waits): measured negative,
    # named, and not modelled (the term is a slowdown)
    cheaper = from_record(probe_record(done=(1.3,) * 3))
    assert cheaper.measured == pytest.approx(-0.2 / (100 * MB)) and cheaper.seconds_per_byte == 0
    assert "cheaper than one after the other, a gain the model does not take" in cheaper.describe()
    # an all-reduce twice as long as backward: only half its bytes run beside backward
    assert per_round(probe_record(reduce=(2.0,) * 3, done=(3.2,) * 3))[0] == pytest.approx(0.2 / (50 * MB))


def test_on_a_gpu_the_term_is_the_backwards_slowdown_per_byte_beside_it():
    # communication has its own engines: the model charges compute nothing for it, so all of 1.2 - 1.0 counts
    term = from_record(probe_record(device="cuda", backend="nccl", beside=(1.2,) * 3, done=(1.25,) * 3))
    assert term.seconds_per_byte == pytest.approx(0.2 / (100 * MB))
    assert "ms per MB reduced beside compute" in term.describe() and "resnet50" in term.describe()


def test_the_newest_probe_of_the_model_is_picked_else_any_models_else_none():
    records = [probe_record("bert-base", time="2024-01-03T00:00:00Z", done=(1.9,) * 3),
               probe_record("resnet50", time="2024-01-01T00:00:00Z"),
               probe_record("resnet50", time="2024-01-02T00:00:00Z", done=(1.8,) * 3),
               probe_record("resnet50", device="cuda", backend="nccl")]
    assert pick(records, "gloo", "cpu", model="resnet50").seconds_per_byte == pytest.approx(0.3 / (100 * MB))
    assert "bert-base" in pick(records, "gloo", "cpu", model="vit").source  # no probe of vit: the newest of any
    assert pick(records, "gloo", "cpu", world_size=4) is None
    assert pick([], "gloo", "cpu", model="resnet50") is None


def test_this_machines_network_carries_the_newest_probe_stored_with_its_all_reduce_records(tmp_path):
    sizes = [allreduce_record("size", n, n, 2, Link(2e-4, 1.5e9).allreduce(4 * n, 2)) for n in (256, 65536, 4 << 20)]
    write(tmp_path / "allreduce.jsonl", *sizes)
    assert comm_model(None, tmp_path).interference is None
    write(tmp_path / "probe.jsonl", probe_record())
    carried = comm_model(None, tmp_path)
    assert carried.interference.seconds_per_byte == pytest.approx(0.2 / (100 * MB))
    # hosts behind a link: the same cores, the same term
    assert comm_model(None, tmp_path, link="1gbit").interference == carried.interference
    assert emulated(carried, "1gbit", 1e9, 1).interference == carried.interference


def with_term(comm: CommModel, seconds_per_mb: float) -> CommModel:
    return dataclasses.replace(comm, interference=Interference(seconds_per_mb / MB, 0.0, "test"))


def test_shared_cores_pay_the_term_for_the_bytes_launched_before_the_last_gradient():
    shared = dataclasses.replace(TOY_NET, shares_cores=True)
    base = simulate(toy_profile(), shared, Schedule(world_size=2))
    slowed = simulate(toy_profile(), with_term(shared, 0.01), Schedule(world_size=2))
    # two 1 MB buckets, ready at 0.1 s and 0.2 s: the first is launched while backward still produces
    # gradients; the last gradient launches the second (as the probe counts them)
    assert slowed.interference == pytest.approx(0.01)
    assert slowed.latency == pytest.approx(base.latency + 0.01)
    # without overlap every bucket starts after backward: nothing runs beside it
    off = Schedule(world_size=2, overlap=False)
    assert simulate(toy_profile(), with_term(shared, 0.01), off).latency == pytest.approx(
        simulate(toy_profile(), shared, off).latency)
    # one rank reduces nothing
    assert simulate(toy_profile(), with_term(shared, 0.01), Schedule(world_size=1)).interference == 0


def test_over_a_link_the_cores_pay_the_term_for_the_bytes_launched_beside_backward():
    # a slow wire: each 1 MB bucket takes 0.01 + 0.2 s; bucket 0 is launched at 0.1 s, before the last gradient
    link = CommModel("link", intra=Link(0.005, MB / 0.04), inter=Link(0.005, MB / 0.2), per_server=1,
                     cpu=Link(0.005, MB / 0.04))
    plan = Schedule(world_size=2)
    slowed = simulate(toy_profile(), with_term(link, 0.1), plan)
    assert slowed.interference == pytest.approx(0.1)
    # the wire is the bottleneck here: the cores' extra work does not lengthen the iteration
    assert slowed.latency == pytest.approx(simulate(toy_profile(), link, plan).latency)
    slow_cores = simulate(toy_profile(), with_term(link, 3.0), plan)
    assert slow_cores.latency > simulate(toy_profile(), link, plan).latency


def test_on_gpus_a_slower_backward_readies_its_gradients_later():
    gpus = CommModel("gpu", intra=Link(0.005, MB / 0.04))
    plan = Schedule(world_size=2)
    base = simulate(toy_profile(), gpus, plan)
    slowed = simulate(toy_profile(), with_term(gpus, 0.05), plan)
    assert slowed.interference == pytest.approx(0.1)  # 2 MB beside backward
    assert [b["ready"] for b in slowed.buckets] == pytest.approx([0.1 * 0.4 / 0.3, 0.2 * 0.4 / 0.3])
    assert slowed.latency == pytest.approx(base.latency + 0.1)  # backward 0.4 s; the last bucket ends at 0.3167 s


def write(path, *records):
    path.write_text("".join(json.dumps({"schema_version": SCHEMA_VERSION, **r}) + "\n" for r in records))
    return path


@pytest.fixture
def machine(tmp_path):
    """A folder with this 'machine's' all-reduce records and a profile of resnet50 (2 co-located copies)."""
    sizes = [allreduce_record("size", n, n, 2, Link(3e-4, 1.8e9).allreduce(4 * n, 2)) for n in (256, 65536, 4 << 20)]
    profile = profile_record()
    profile["config"]["world_size"] = 2
    write(tmp_path / "allreduce.jsonl", *sizes)
    write(tmp_path / "profile.jsonl", profile)
    return tmp_path


def test_predict_says_it_has_no_interference_term_and_uses_one_where_a_probe_exists(machine, capsys):
    argv = ["predict", "--profile", str(machine / "profile.jsonl"), "--model", "resnet50", "--allreduce",
            str(machine), "--world-size", "2", "--colocated", "2"]
    assert main(argv) == 0
    assert "interference: none modelled (no interference probe among the --allreduce or --profile records" in \
        capsys.readouterr().out
    assert main([*argv, "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)["predictions"][0]
    write(machine / "probe.jsonl", probe_record(done=(2.0,) * 3))  # 0.5 s per 100 MB
    assert main([*argv, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    row = result["predictions"][0]
    assert result["interference"]["seconds_per_byte"] == pytest.approx(0.5 / (100 * MB))
    assert row["interference_ms"] > 0
    assert row["latency_ms"] == pytest.approx(plain["latency_ms"] + row["interference_ms"])
    assert main([*argv, "--interference", "none", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["predictions"][0]["latency_ms"] == pytest.approx(plain["latency_ms"])


def test_a_cluster_takes_only_a_gpu_probe_given_by_name(machine, capsys):
    argv = ["predict", "--profile", str(machine / "profile.jsonl"), "--model", "resnet50", "--cluster",
            "paper-v100-nccl", "--world-size", "16", "--compute-s", "0.05", "--colocated", "2"]
    assert main(argv) == 0
    assert "interference: none modelled (no probe of paper-v100-nccl's GPUs" in capsys.readouterr().out
    write(machine / "cpu_probe.jsonl", probe_record())
    assert main([*argv, "--interference", str(machine / "cpu_probe.jsonl")]) == 2
    assert "holds no interference probe of backend='nccl' on device='cuda'" in capsys.readouterr().err
    write(machine / "gpu_probe.jsonl", probe_record(device="cuda", backend="nccl", beside=(1.3,) * 3))
    assert main([*argv, "--interference", str(machine / "gpu_probe.jsonl"), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["interference"]["seconds_per_byte"] == pytest.approx(0.3 / (100 * MB))
    assert result["predictions"][0]["interference_ms"] > 0


def test_the_validation_predicts_each_run_with_its_models_probe(machine):
    run = {"kind": "run", "status": "ok", "latency_s": [0.2] * 5, "env": {"time": "2024-01-01T00:00:00Z"},
           "config": {**profile_record()["config"], "world_size": 2, "backend": "gloo", "impl": "ddp_core",
                      "comm_hook": "none", "bucket_mb": 25.0, "sync_every": 1, "process_groups": 1}}
    write(machine / "runs.jsonl", run)
    without = prediction_errors(machine)
    write(machine / "probe.jsonl", probe_record("bert-base", done=(9.0,) * 3), probe_record(done=(2.0,) * 3))
    (plain,), (slowed,) = without, prediction_errors(machine)
    assert plain["interference"] is None and "probe of resnet50" in slowed["interference"]
    assert slowed["predicted_s"] > plain["predicted_s"]
    assert prediction_errors(machine, interference=False)[0]["predicted_s"] == pytest.approx(plain["predicted_s"])
