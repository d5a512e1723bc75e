"""The user's own model: every kind of `--model` spec end to end at world size 2, every bad spec refused
before any rank starts, `--amp bf16` on the CPU, the file's hash in the config, and `advise` end to end."""
import json
import re

import pytest

from experiments.cli import main
from experiments.core.records import read_records
from experiments.measure.configs import expand_grid
from experiments.measure.sweep import run_sweep
from tests.unit.test_own_model import EXAMPLE, _write


GPT2_TINY = "n_layer=2,n_embd=32,n_head=2,vocab_size=500"


SMALL = {"world_size": [2], "image_size": [16], "seq_len": [8], "batch_size": [2], "iters": [2], "warmup": [1],
         "threads": [1]}


def test_every_kind_of_spec_trains_at_world_size_2_with_equal_replicas(tmp_path):
    configs = [*expand_grid({**SMALL, "model": ["torchvision:resnet18", EXAMPLE, "examples.my_model"]}),
               *expand_grid({**SMALL, "model": ["transformers:gpt2"], "model_config": [GPT2_TINY],
                             "amp": ["none", "bf16"]})]
    out = tmp_path / "records.jsonl"
    assert run_sweep(configs, out, echo=lambda line: None) == {"ok": 5, "failed": 0, "skipped": 0}
    records = {(r["config"]["model"], r["config"]["amp"]): r for r in read_records(out)}
    assert all(r["status"] == "ok" and r["correct"] for r in records.values())
    assert records[("torchvision:resnet18", "none")]["model_size"]["parameters"] == 11_689_512  # torchvision's count
    file_record = records[(EXAMPLE, "none")]
    assert re.fullmatch(r"[0-9a-f]{16}", file_record["config"]["model_hash"])
    assert records[("examples.my_model", "none")]["config"]["model_hash"] == file_record["config"]["model_hash"]
    gpt2 = records[("transformers:gpt2", "bf16")]
    assert gpt2["config"]["model_config"] == GPT2_TINY
    assert gpt2["model_size"]["gradient_bytes"] == 4 * gpt2["model_size"]["parameters"]  # float32 gradients under amp


UNUSED = """import torch
from torch import nn


def build_model():
    return nn.ModuleDict({"used": nn.Linear(4, 2), "never": nn.Linear(4, 2)})


def make_batch(model, batch_size, image_size, seq_len, generator):
    return {"x": torch.randn(batch_size, 4, generator=generator)}


def loss(model, batch):
    return model.module["used"](batch["x"]).sum() if hasattr(model, "module") else model["used"](batch["x"]).sum()
"""


def test_advise_end_to_end_marks_every_figure_and_warns_for_a_gpu_cluster(tmp_path, capsys):
    out = tmp_path / "advice" / "mine"
    argv = ["advise", "--model", EXAMPLE, "--image-size", "8", "--batch-size", "2", "--iters", "2", "--warmup", "1",
            "--cluster", "paper-v100-nccl", "--world-size", "16"]
    assert main([*argv, "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert "a CPU profile used for the GPU cluster" in captured.out
    report = json.loads(out.with_name("mine.json").read_text())
    kinds = {f["figure"]: f["kind"] for f in report["figures"]}
    assert kinds["iteration at 16 ranks, 25 MB buckets"] == "predicted"
    assert kinds["find_unused_parameters cost (forward, one process)"] == "measured"
    assert kinds["recommended bucket cap"] == "predicted"
    assert kinds["bucket_cap_mb='auto' (ddp_core) would try"] == "predicted"
    tried = next(f["value"] for f in report["figures"] if f["figure"] == "bucket_cap_mb='auto' (ddp_core) would try")
    assert tried.startswith("25/1 MB, ") and "keep the fastest measured" in tried, tried
    assert {"counted", "measured", "predicted"} <= set(kinds.values())
    # memory: the profile's peak (a process with torch loaded holds hundreds of MB) and bucket views' saving
    figures = {f["figure"]: f for f in report["figures"]}
    assert kinds["peak memory of a rank (the profile's measured iterations)"] == "measured"
    assert figures["peak memory of a rank (the profile's measured iterations)"]["number"] > 100
    size = read_records(out.with_name("mine.profile.jsonl"))[0]["model_size"]
    assert figures["gradient_as_bucket_view memory"]["number"] == pytest.approx(-size["gradient_bytes"] / 2**20)
    assert report["buckets"] and "profile: examples/my_model.py on cpu, batch 2, image size 8" in report["profile"]
    assert "| recommended bucket cap |" in out.with_name("mine.md").read_text()
    assert read_records(out.with_name("mine.profile.jsonl"))[0]["kind"] == "profile"  # usable by predict

    # A model with a parameter that never gets a gradient: found, its search cost measured, no timing profile.
    unused = _write(tmp_path, "unused.py", UNUSED)
    assert main(["advise", "--model", unused, "--iters", "2", "--warmup", "1", "--cluster", "paper-v100-nccl"]) == 0
    text = capsys.readouterr().out
    assert "yes: 2 parameter(s) get no gradient (never.weight, never.bias)" in text
    assert "needs DDP's find_unused_parameters (`ddpbench run --find-unused-parameters true`)" in text

    # Predicting for this machine needs its all-reduce records.
    assert main(["advise", "--model", EXAMPLE, "--allreduce", str(tmp_path / "none")]) == 2
    assert "no all-reduce records at" in capsys.readouterr().err
