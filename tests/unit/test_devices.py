"""Predictions say what they rest on: a profile or trace of another device than the network's is warned
about before any figure, naming both devices, in predict, tune-bucket and advise."""
import contextlib
import json
import sys

import pytest

from experiments.cli import main
from experiments.core.records import SCHEMA_VERSION
from experiments.perfmodel.devices import families
from experiments.perfmodel.gpus import scale_profile_record

MB = 1024 * 1024


def profile_record(model="resnet50", device="cpu", gpu=None, cpu="Test CPU", time="2024-01-01T00:00:00Z"):
    """A profile record of two gradients, as `ddpbench profile` writes one (made by hand: the warnings are
    about where it was measured, not about its times)."""
    synced = [{"forward": 0.01, "backward": 0.02, "tail": 0.001, "optimizer": 0.002, "ready": [0.01, 0.02]}] * 3
    config = {"model": model, "device": device, "world_size": 1, "batch_size": 2, "image_size": 32, "seq_len": 16,
              "threads": 1, "model_config": "", "amp": "none"}
    return {"kind": "profile", "status": "ok", "config": config, "synced": synced,
            "skipped": [{"forward": 0.01, "backward": 0.02}] * 3, "names": ["fc.weight", "conv.weight"],
            "bytes": [4 * MB, 8 * MB], "dtypes": ["torch.float32"] * 2, "buffer_bytes": 0,
            "summary": {"forward": 0.01, "backward": 0.02, "tail": 0.001, "optimizer": 0.002, "p50": 0.033},
            "env": {"gpu": gpu, "cpu": cpu, "time": time}}


def write(path, *records):
    path.write_text("".join(json.dumps({"schema_version": SCHEMA_VERSION, **r}) + "\n" for r in records))
    return path


def run_in_order(argv, capsys) -> tuple[int, str]:
    """Run the command line with stderr and stdout in one stream, in the order they were written."""
    with contextlib.redirect_stderr(sys.stdout):
        status = main(argv)
    return status, capsys.readouterr().out


def test_gpu_families_are_whole_words():
    assert families("NVIDIA A100-SXM4-80GB") == ("a100",)
    assert families("NVIDIA H100 80GB HBM3") == ("h100",)
    assert families("NVIDIA L40S") == ("l40s",) and families("NVIDIA A10") == ("a10",)
    assert families("Synthetic GPU") == () and families(None) == ()


def test_the_newest_profile_scaled_to_a_v100_is_warned_about_for_an_h100_cluster_before_any_table(tmp_path, capsys):
    # The case: tune-bucket silently took the newest profile, one scaled to a V100, for an H100 cluster.
    measured = profile_record()
    path = write(tmp_path / "profiles.jsonl", measured, scale_profile_record(measured, "v100"))
    argv = ["tune-bucket", "--profile", str(path), "--model", "resnet50", "--cluster", "dgx-h100-nccl",
            "--world-size", "64"]
    status, text = run_in_order(argv, capsys)
    assert status == 0
    warning = next(line for line in text.splitlines() if "warning" in line)
    assert "the profile is of V100 (estimated from FLOPs), the cluster --cluster=dgx-h100-nccl has H100/H200" in warning
    assert "--compute-s" in warning and "scale-profile --gpu h100" in warning
    assert text.index("warning") < text.index("latency ms") < text.index("recommended --bucket-mb")
    # the same profile for the V100 testbed it was scaled to: nothing to warn about
    status, text = run_in_order([*argv[:6], "paper-v100-nccl", "--world-size", "64"], capsys)
    assert status == 0 and "warning" not in text
    # --compute-s states the compute: no warning either
    status, text = run_in_order([*argv, "--compute-s", "0.02"], capsys)
    assert status == 0 and "warning" not in text


def test_a_cpu_profile_on_any_gpu_preset_is_warned_about_naming_its_gpus(tmp_path, capsys):
    path = write(tmp_path / "cpu.jsonl", profile_record())
    for cluster, gpus in (("dgx-h100-nccl", "H100/H200"), ("dgx-a100-nccl", "A100"), ("paper-v100-gloo", "V100")):
        status, text = run_in_order(["predict", "--profile", str(path), "--model", "resnet50", "--cluster", cluster],
                                    capsys)
        assert status == 0
        assert f"warning: a CPU profile used for the GPU cluster --cluster={cluster} ({gpus})" in text
        assert "this CPU (Test CPU)" in text and text.index("warning") < text.index("latency ms")


def test_a_gpu_profile_is_checked_against_the_clusters_gpu_and_against_a_cpu_fit(tmp_path, capsys):
    h100 = write(tmp_path / "h100.jsonl", profile_record(device="cuda", gpu="NVIDIA H100 80GB HBM3"))
    argv = ["predict", "--profile", str(h100), "--model", "resnet50", "--json"]
    assert main([*argv, "--cluster", "dgx-h100-nccl"]) == 0
    out, err = capsys.readouterr()
    assert "warning" not in err and json.loads(out)["warnings"] == []
    assert main([*argv, "--cluster", "dgx-a100-nccl"]) == 0
    out, err = capsys.readouterr()
    assert "the profile is of NVIDIA H100 80GB HBM3, the cluster --cluster=dgx-a100-nccl has A100" in err
    assert json.loads(out)["warnings"] == [err.split("warning: ", 1)[1].strip()]
    fit = write(tmp_path / "allreduce.jsonl", *[
        {"kind": "allreduce", "status": "ok", "latency_s": [seconds] * 3,
         "config": {"mode": "size", "backend": "gloo", "device": "cpu", "world_size": 2, "elements": n,
                    "total_elements": n, "reps": 3, "warmup": 1, "threads": 1}}
        for n, seconds in ((256, 1e-3), (1 << 20, 5e-3), (1 << 24, 0.05))])
    assert main([*argv, "--allreduce", str(fit)]) == 0
    assert "a profile of NVIDIA H100 80GB HBM3 predicted with this machine's CPU all-reduce fit" in \
        capsys.readouterr().err


def test_advise_warns_of_a_cpu_profile_for_a_gpu_cluster_before_it_measures(monkeypatch, capsys):
    from experiments.measure import sweep

    def refuse(*args, **kwargs):
        raise RuntimeError("measuring started")

    monkeypatch.setattr(sweep, "run_jobs", refuse)
    with contextlib.redirect_stderr(sys.stdout), pytest.raises(RuntimeError, match="measuring started"):
        main(["advise", "--model", "resnet-tiny", "--device", "cpu", "--cluster", "h100-400g-nccl",
              "--world-size", "16"])
    out = capsys.readouterr().out
    assert "warning: a CPU profile used for the GPU cluster --cluster=h100-400g-nccl (H100/H200)" in out
    assert "profiling" not in out.split("warning")[0]
