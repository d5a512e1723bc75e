"""The user's own model: every kind of `--model` spec end to end at world size 2, every bad spec refused
before any rank starts, `--amp bf16` on the CPU, the file's hash in the config, and `advise` end to end."""
import dataclasses
import json
import re

import pytest

from experiments.cli import main
from experiments.core.records import config_key, read_records
from experiments.measure.configs import expand_grid
from experiments.measure.sweep import run_sweep

EXAMPLE = "examples/my_model.py"
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


def test_a_changed_file_is_a_different_config(tmp_path):
    path = tmp_path / "mine.py"
    path.write_text(open(EXAMPLE).read())
    (first,) = expand_grid({"model": [str(path)]})
    path.write_text(open(EXAMPLE).read().replace("width: int = 32", "width: int = 33"))
    (second,) = expand_grid({"model": [str(path)]})
    assert first.model == second.model and first.model_hash != second.model_hash
    assert config_key(dataclasses.asdict(first)) != config_key(dataclasses.asdict(second))  # compare never pairs them
    # a built-in model's config key is what it was before these fields existed
    (builtin,) = expand_grid({"model": ["resnet-tiny"]})
    assert "model_hash" not in config_key(dataclasses.asdict(builtin))


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


BAD = [
    (["--model", "torchvision:resnet81"], r"no classification model 'resnet81'; did you mean torchvision:resnet18"),
    (["--model", "torchvision:fasterrcnn_resnet50_fpn"], r"is a detection model; torchvision: takes the \d+ image"),
    (["--model", "torchvision:resnet18", "--model-config", "depth=3"], r"unexpected keyword argument 'depth'"),
    (["--model", "torchvision:alexnet", "--image-size", "16"], r"with --image-size 16: .*a larger --image-size"),
    (["--model", "transformers:gtp2"], r"no model type 'gtp2'; did you mean transformers:gpt2"),
    (["--model", "transformers:gpt2", "--model-config", "n_layers=2"], r"GPT2Config has no field 'n_layers'; did you mean n_layer"),
    (["--model", "transformers:gpt2", "--model-config", "n_layer=two"], r"n_layer='two' is not a valid int"),
    (["--model", "transformers:gpt2", "--model-config", "n_positions=4", "--seq-len", "8"], r"max_position_embeddings=4"),
    (["--model", "transformers:llama"], r"M parameters: 2 rank\(s\) need at least \d+ GiB"),
    (["--model", "no/such/file.py"], r"--model='no/such/file.py': no such file"),
    (["--model", "no_such_package.module"], r"no module named 'no_such_package'"),
    (["--model", "resnet18"], r"'resnet18' is not allowed; choose one of .*did you mean torchvision:resnet18"),
    (["--model", "bert-tiny", "--model-config", "x=1"], r"--model-config applies to .* not to the built-in"),
    (["--model", EXAMPLE, "--model-config", "height=3"], r"build_model does not take \['height'\]"),
    (["--amp", "fp16"], r"--amp fp16 needs --device cuda"),
    (["--amp", "fp8"], r"--amp='fp8' is not allowed"),
]


@pytest.mark.parametrize("argv, needle", BAD)
def test_bad_spec_exits_2_naming_the_problem_and_writes_nothing(tmp_path, capsys, argv, needle):
    out = tmp_path / "records.jsonl"
    assert main(["run", *argv, "--out", str(out)]) == 2
    assert re.search(needle, capsys.readouterr().err)
    assert not out.exists()


@pytest.mark.parametrize("text, needle", [
    ("import no_such_dependency_xyz\n", r"failed to import:\n.*ModuleNotFoundError: No module named 'no_such_dependency_xyz'"),
    ("def build_model(:\n", r"failed to import:\n.*SyntaxError"),
    ("raise SystemExit('bye')\n", r"failed to import:\n.*SystemExit: bye"),
    ("def build_model():\n    pass\n\ndef loss(model, batch):\n    pass\n", r"lacks make_batch; a workload defines"),
])
def test_a_broken_user_file_is_refused_with_its_error(tmp_path, capsys, text, needle):
    path = _write(tmp_path, "broken.py", text)
    assert main(["run", "--model", path, "--out", str(tmp_path / "r.jsonl")]) == 2
    assert re.search(needle, capsys.readouterr().err, re.S)


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
