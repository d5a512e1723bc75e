"""The user's own model: every kind of `--model` spec end to end at world size 2, every bad spec refused
before any rank starts, `--amp bf16` on the CPU, the file's hash in the config, and `advise` end to end."""
import dataclasses
import re

import pytest

from experiments.cli import main
from experiments.core.records import config_key
from experiments.measure.configs import expand_grid

EXAMPLE = "examples/my_model.py"


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
