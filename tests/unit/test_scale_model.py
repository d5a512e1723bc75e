"""The scale model: emulated compute has the model's parameters and replays a profile's gradient
order and times under ddp_core and PyTorch's DDP; time dilation scales what it says; a 4-rank sweep
with emulated compute runs over 2 emulated hosts; bad input is refused before any rank starts."""

import pytest
import torch

from experiments.cli import main
from experiments.core.profile import ComputeProfileError, Profile
from experiments.core.records import append_record, read_records
from experiments.emulate import network
from experiments.emulate.compute import StandIn, model_layout
from experiments.measure.workloads import user_file, workload
from experiments.perfmodel.comm import CommModel, Link, scale_model
from experiments.perfmodel.gpus import estimated_seconds, scale_profile_record

FORWARD, STEP, GAP = 0.010, 0.005, 0.004  # seconds: the synthetic profile's forward, step, and gap between gradients


def synthetic_profile(model: str = "resnet-tiny", copies: int = 1, seed: int = 0) -> dict:
    """A profile record of `model` whose gradients arrive GAP apart in a shuffled order (not the
    reverse of registration, so that following the profile is what puts them in that order)."""
    layout = model_layout(workload(model).MODELS[model])
    params = list(layout.parameters())
    order = torch.randperm(len(params), generator=torch.Generator().manual_seed(seed)).tolist()
    ready = [0.0] * len(params)
    for position, index in enumerate(order):
        ready[index] = (position + 1) * GAP
    backward = (len(params) + 1) * GAP
    row = {"forward": FORWARD, "backward": backward, "tail": 0.001, "optimizer": STEP, "ready": ready}
    config = {"model": model, "backend": "gloo", "device": "cpu", "world_size": copies, "bucket_mb": 25.0,
              "sync_every": 1, "impl": "ddp_core_no_overlap", "process_groups": 1, "comm_hook": "none",
              "batch_size": 2, "image_size": 16, "seq_len": 8, "iters": 3, "warmup": 1, "seed": 0, "threads": 1}
    return {"kind": "profile", "status": "ok", "config": config,
            "summary": {"forward": FORWARD, "backward": backward, "tail": 0.001, "optimizer": STEP,
                        "p50": FORWARD + backward + 0.001 + STEP, "copies_p50": [FORWARD + backward + 0.001 + STEP]},
            "synced": [row] * 3, "skipped": [{"forward": FORWARD, "backward": backward / 2}] * 3,
            "names": [n for n, _ in layout.named_parameters()],
            "bytes": [p.numel() * p.element_size() for p in params], "dtypes": [str(p.dtype) for p in params],
            "buffer_bytes": 0, "slowest_copy": 0, "other_copies": []}


@pytest.mark.parametrize("model", ["resnet-tiny", "bert-tiny"])
def test_the_stand_in_has_exactly_the_models_parameters_and_buffers(model):
    real = workload(model).MODELS[model]()  # bert-tiny ties its decoder to the embeddings: one parameter
    stand_in = StandIn(model_layout(workload(model).MODELS[model]),
                       Profile.from_record(synthetic_profile(model)), 1.0, torch.device("cpu"))
    described = [(n, p.shape, p.dtype, p.requires_grad) for n, p in real.named_parameters()]
    assert [(n, p.shape, p.dtype, p.requires_grad) for n, p in stand_in.named_parameters()] == described
    assert [(n, b.shape, b.dtype) for n, b in stand_in.named_buffers()] == \
        [(n, b.shape, b.dtype) for n, b in real.named_buffers()]


# the DDPs rebuild their buckets (CPU work in the second forward, which load stretches by up to a few 100 ms)


def test_a_profile_scaled_to_a_gpu_says_so_and_keeps_the_proportions():
    record = synthetic_profile("resnet50")
    scaled = scale_profile_record(record, "v100")
    measured, gpu = Profile.from_record(record), Profile.from_record(scaled)
    assert gpu.forward + gpu.backward + gpu.optimizer == pytest.approx(estimated_seconds("resnet50", "v100"))
    assert gpu.ready[0] / gpu.backward == pytest.approx(measured.ready[0] / measured.backward)
    assert gpu.tail == pytest.approx(2 * sum(record["bytes"]) / 900e9)  # a copy at memory bandwidth
    assert scaled["scaled_to"]["gpu"] == "v100" and "FLOPs" in scaled["scaled_to"]["basis"]


def test_the_scale_models_network_undilates_this_machines_loopback():
    loopback = CommModel(name="fit", intra=Link(alpha=100e-6, busbw=0.5e9), shares_cores=True)
    comm = scale_model(loopback, "100gbit", 100e9, ranks_per_host=8, dilation=50)
    assert comm.link(8).busbw == pytest.approx(25e9) and comm.link(8).alpha == pytest.approx(2e-6)
    assert comm.link(16).busbw == pytest.approx(12.5e9)  # the slower level: the link between hosts
    assert not comm.on_compute_cores(16)  # emulated compute only waits: communication overlaps it
    assert network.dilated("100gbit", 50) == "2000000kbit" and network.dilated("1gbit", 1) == "1gbit"


def test_bad_compute_options_exit_2_before_any_rank_starts(tmp_path, capsys):
    profile = tmp_path / "p.jsonl"
    append_record(profile, synthetic_profile("resnet-tiny"))
    base = ["run", "--model", "bert-tiny", "--world-size", "2", "--out", str(tmp_path / "r.jsonl")]
    cases = {
        ("--compute", "emulated"): "needs --compute-profile",
        ("--compute", "emulated", "--compute-profile", str(profile)): "holds no profile of --model='bert-tiny'",
        ("--compute", "emulated", "--compute-profile", str(tmp_path / "missing.jsonl")): "no record file",
        ("--time-dilation", "4"): "needs --compute emulated",
        ("--compute", "emulated", "--compute-profile", str(profile), "--time-dilation", "0.5"): "must be >= 1",
        ("--compute", "simulated"): "--compute='simulated' is not allowed",
    }
    for extra, message in cases.items():
        assert main([*base, *extra]) == 2
        assert message in capsys.readouterr().err
    assert not (tmp_path / "r.jsonl").exists()
    with pytest.raises(ComputeProfileError, match="another configuration"):
        StandIn(model_layout(workload("bert-tiny").MODELS["bert-tiny"]),
                Profile.from_record(synthetic_profile("resnet-tiny")), 1.0, torch.device("cpu"))


MLP = '''
import torch
from torch import nn


def build_model(hidden: int = 16):
    return nn.Sequential(nn.Linear(8, hidden), nn.ReLU(), nn.Linear(hidden, 4))


def make_batch(model, batch_size, image_size, seq_len, generator):
    return {"x": torch.randn(batch_size, 8, generator=generator), "y": torch.randn(batch_size, 4, generator=generator)}


def loss(model, batch):
    return nn.functional.mse_loss(model(batch["x"]), batch["y"])
'''


def test_a_user_models_training_flops_are_its_matrix_products_counted_by_hand(tmp_path):
    from experiments.perfmodel.flops import training_flops

    path = tmp_path / "mlp.py"
    path.write_text(MLP)
    # 2 FLOPs per multiply-add. Forward: x (B x 8) @ W1 (8 x 16), h (B x 16) @ W2 (16 x 4). Backward: each
    # weight's gradient (as many multiply-adds as its forward), and the gradient of h (B x 4 @ 4 x 16); not
    # that of x, which needs none. Bias gradients are sums, which FlopCounterMode does not count.
    batch = 3
    by_hand = 2 * batch * (8 * 16 + 16 * 4) * 2 + 2 * batch * 4 * 16
    assert training_flops(str(path), "", batch, 64, 32) == by_hand == 2688
    assert training_flops(str(path), "hidden=32", batch, 64, 32) == 2 * batch * (8 * 32 + 32 * 4) * 2 + 2 * batch * 4 * 32

    # scale-profile: the user's model at the asked batch, through the command line
    record = synthetic_profile()
    record["config"].update(model=str(path), model_config="", model_hash=user_file.file_hash(path))
    profiles, out = tmp_path / "profile.jsonl", tmp_path / "v100.jsonl"
    append_record(profiles, record)
    assert main(["scale-profile", "--profile", str(profiles), "--model", str(path), "--gpu", "v100",
                 "--batch-size", "6", "--out", str(out)]) == 0
    scaled = read_records(out)[0]["scaled_to"]
    assert scaled["training_flops"] == 2 * by_hand and scaled["inputs"]["batch_size"] == 6
    assert Profile.from_record(read_records(out)[0]).compute - scaled["compute_s"] == pytest.approx(0, abs=1e-12)
    path.write_text(MLP.replace("hidden: int = 16", "hidden: int = 17"))  # not the file that was profiled
    assert main(["scale-profile", "--profile", str(profiles), "--model", str(path), "--gpu", "v100",
                 "--out", str(tmp_path / "other.jsonl")]) == 2


def test_the_built_in_models_flops_are_counted_too_at_the_papers_inputs():
    from experiments.perfmodel.flops import training_flops

    resnet = training_flops("resnet50", "", 32, 224, 32)
    # ResNet50 is 4.1 G multiply-adds forward per 224x224 image (8.2 GFLOPs); backward about twice that.
    assert resnet == pytest.approx(3 * 2 * 4.1e9 * 32, rel=0.02)
    assert estimated_seconds("resnet50", "v100") == pytest.approx(resnet / (0.4 * 15.7e12))
    # BERT-base: about 6 FLOPs per parameter and token (2 forward, 4 backward), attention on top.
    assert training_flops("bert-base", "", 16, 64, 128) == pytest.approx(6 * 110e6 * 16 * 128, rel=0.05)
