"""Bad input that used to get through the checks: each is refused before any rank starts, with exit 2 and
one line naming the parameter, the value and what is allowed, and nothing is written.

Seen on fresh clones: `--bucket-mb nan` measured and then failed to write its record; `--timeout inf`
failed every config; `--model /etc/passwd` and `activation_function=x` ended in tracebacks; a workload
file whose make_batch returned a list failed 20 s later inside the ranks.
"""
import math
import re
from pathlib import Path

import pytest

from experiments.cli import build_parser, main
from experiments.core.config import ConfigError
from experiments.measure import sweep
from experiments.measure.configs import expand_grid
from experiments.measure.workloads import spec as model_spec

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = str(ROOT / "examples" / "my_model.py")
PROFILE = str(ROOT / "results" / "reference" / "x86_64-2cpu" / "advise" / "gpt2.profile.jsonl")  # a stored profile (2 co-located copies)
FAST = ["--world-size", "1", "--iters", "1", "--warmup", "0"]


@pytest.fixture(autouse=True)
def no_ranks(monkeypatch):
    """Every sub-command that measures starts its ranks through sweep.RankPool: here, starting any fails."""
    def refuse(*args, **kwargs):
        raise AssertionError("a rank was started for bad input")

    monkeypatch.setattr(sweep, "RankPool", refuse)


def refused(capsys, argv, needle, out=None):
    """Run the CLI; assert exit 2, one line of error matching `needle`, and no record file."""
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert re.search(needle, err), err
    assert "\n" not in err, err
    if out is not None:
        assert not out.exists()
    return err


# --- floats that are not finite ---

@pytest.mark.parametrize("flag, value", [("--bucket-mb", "nan"), ("--bucket-mb", "inf"), ("--bucket-mb", "25,-inf"),
                                         ("--time-dilation", "inf"), ("--time-dilation", "nan")])
def test_run_refuses_a_float_that_is_not_finite(tmp_path, capsys, flag, value):
    out = tmp_path / "r.jsonl"
    bad = value.split(",")[-1]
    refused(capsys, ["run", flag, value, *FAST, "--out", str(out)],
            rf"{flag}: '{re.escape(bad)}' is not allowed; it must be a finite number", out)


def test_configs_given_as_data_are_checked_for_finite_floats_too():
    # plans and presets build configs without parse_list: nan passes every `<` check
    with pytest.raises(ConfigError, match=r"--bucket-mb=nan is not allowed; it must be a finite number"):
        expand_grid({"bucket_mb": [math.nan]})
    with pytest.raises(ConfigError, match=r"--time-dilation=inf is not allowed; it must be a finite number"):
        expand_grid({"time_dilation": [math.inf], "compute": ["emulated"], "compute_profile": ["p.jsonl"]})


@pytest.mark.parametrize("command", ["run", "allreduce", "train", "profile"])
@pytest.mark.parametrize("value", ["inf", "nan", "1e15", "0"])
def test_timeout_must_be_a_finite_number_of_seconds(tmp_path, capsys, command, value):
    out = tmp_path / "r.jsonl"
    refused(capsys, [command, "--timeout", value, "--out", str(out)],
            r"--timeout=\S+ is not allowed; it must be > 0 and at most 31536000 seconds \(a year\)", out)


def test_main_gives_the_caller_its_own_signal_handlers_back(tmp_path, capsys):
    """main() turns SIGTERM into Ctrl-C while it runs; a program calling it keeps its own handlers."""
    import signal

    def callers_own(signum, frame):
        raise AssertionError("never called")

    signal.signal(signal.SIGTERM, callers_own)
    signal.signal(signal.SIGINT, callers_own)
    assert main(["run", "--timeout", "0", "--out", str(tmp_path / "r.jsonl")]) == 2
    assert signal.getsignal(signal.SIGTERM) is callers_own
    assert signal.getsignal(signal.SIGINT) is callers_own


def test_train_refuses_an_infinite_learning_rate(tmp_path, capsys):
    out = tmp_path / "t.jsonl"
    refused(capsys, ["train", "--lr", "inf", "--iters", "2", "--world-size", "1", "--out", str(out)],
            r"--lr=inf is not allowed; it must be a finite number > 0", out)


@pytest.mark.parametrize("argv, needle", [
    (["--compute-s", "inf"], r"--compute-s=inf is not allowed; it must be a finite number > 0"),
    (["--first-bucket-mb", "nan"], r"--first-bucket-mb=nan is not allowed; it must be a finite number >= 0"),
    (["--first-bucket-mb", "inf"], r"--first-bucket-mb=inf is not allowed; it must be a finite number >= 0"),
    (["--bucket-mb", "1,inf"], r"--bucket-mb: 'inf' is not allowed; it must be a finite number"),
])
def test_predict_refuses_floats_that_are_not_finite(capsys, argv, needle):
    refused(capsys, ["predict", "--profile", PROFILE, "--model", "transformers:gpt2", "--colocated", "2",
                     "--cluster", "paper-v100-nccl", *argv], needle)


@pytest.mark.parametrize("argv, needle", [
    (["--compute-s", "inf"], r"--compute-s=inf is not allowed; it must be a finite number > 0"),
    (["--timeout", "inf"], r"--timeout=inf is not allowed; it must be > 0 and at most 31536000 seconds"),
])
def test_advise_refuses_floats_that_are_not_finite(capsys, argv, needle):
    refused(capsys, ["advise", "--model", "resnet-tiny", "--cluster", "paper-v100-nccl", *argv], needle)


def test_timeout_help_says_it_includes_the_ranks_start_up():
    run = build_parser().parse_args(["run", "--out", "x"])  # (the parser itself, for its sub-commands)
    help_text = run.subcommands["run"].format_help()
    assert re.search(r"includes\s+the\s+ranks'\s+start-up", help_text)


# --- --model: files that are not workloads, values a model cannot use ---

def test_a_file_that_is_not_python_is_refused_quoting_the_contract(tmp_path, capsys):
    passwd = tmp_path / "passwd"
    passwd.write_text("root:x:0:0:root:/root:/bin/bash\n")
    out = tmp_path / "r.jsonl"
    err = refused(capsys, ["run", "--model", str(passwd), *FAST, "--out", str(out)],
                  r"--model='.*passwd' is not a Python file \(its name must end in \.py\); a workload file defines "
                  r"build_model\(\*\*model_config\) -> torch\.nn\.Module", out)
    assert "make_batch(model, batch_size, image_size, seq_len, generator) -> dict of str -> torch.Tensor" in err


def test_a_transformers_value_its_model_cannot_use_names_the_field(tmp_path, capsys):
    out = tmp_path / "r.jsonl"
    # (token ids inside the small vocabulary: else transformers warns of them, on lines of its own)
    refused(capsys, ["run", "--model", "transformers:gpt2", "--model-config",
                     "n_layer=1,n_embd=32,n_head=2,vocab_size=100,bos_token_id=0,eos_token_id=0,activation_function=x",
                     *FAST, "--out", str(out)],
            r"--model-config activation_function='x' for 'transformers:gpt2': the model cannot be built or run "
            r"with it .*KeyError: 'x'", out)


def test_a_transformers_value_of_the_wrong_type_names_the_field(tmp_path, capsys):
    out = tmp_path / "r.jsonl"
    refused(capsys, ["run", "--model", "transformers:gpt2", "--model-config", "n_layer=1,n_inner=x", *FAST,
                     "--out", str(out)],
            r"--model-config n_inner='x' for 'transformers:gpt2': the configuration refuses it", out)


@pytest.mark.parametrize("value", ["x", "-1", "2.5"])
def test_a_torchvision_class_count_must_be_a_positive_integer(tmp_path, capsys, value):
    out = tmp_path / "r.jsonl"
    refused(capsys, ["run", "--model", "torchvision:resnet18", "--model-config", f"num_classes={value}", *FAST,
                     "--out", str(out)],
            rf"--model-config num_classes='{re.escape(value)}' is not allowed; it must be an integer >= 1", out)


# --- a workload file that breaks the contract: caught by one dry batch in the parent ---

WORKLOAD = """import numpy as np
import torch
from torch import nn


def build_model():
    return nn.Linear(4, 2)


def make_batch(model, batch_size, image_size, seq_len, generator):
    return {BATCH}


def loss(model, batch):
    return {LOSS}
"""
GOOD_BATCH = '{"x": torch.randn(batch_size, 4, generator=generator)}'
GOOD_LOSS = 'model(batch["x"]).pow(2).mean()'
BATCH_CONTRACT = r"the contract is make_batch\(model, batch_size, image_size, seq_len, generator\) -> dict of str -> torch\.Tensor"
LOSS_CONTRACT = r"the contract is loss\(model, batch\) -> scalar torch\.Tensor"


@pytest.mark.parametrize("batch, loss, needle", [
    ("[torch.randn(batch_size, 4, generator=generator)]", GOOD_LOSS, rf"make_batch returned a list, not a dict; {BATCH_CONTRACT}"),
    ("None", GOOD_LOSS, rf"make_batch returned None, not a dict; {BATCH_CONTRACT}"),
    ('{"x": np.zeros((batch_size, 4), dtype=np.float32)}', GOOD_LOSS,
     rf"make_batch returned a dict whose 'x' is a numpy\.ndarray, not a torch\.Tensor; {BATCH_CONTRACT}"),
    ("{0: torch.randn(batch_size, 4)}", GOOD_LOSS, rf"make_batch returned a dict with the key 0, not a str; {BATCH_CONTRACT}"),
    (GOOD_BATCH, 'model(batch["x"])', rf"loss returned a tensor of shape \(2, 2\), not a scalar .*; {LOSS_CONTRACT}"),
    (GOOD_BATCH, "1.0", rf"loss returned a float, not a torch\.Tensor; {LOSS_CONTRACT}"),
    (GOOD_BATCH, 'batch["x"].sum()', rf"loss returned a tensor without a gradient .*; {LOSS_CONTRACT}"),
])
def test_a_workload_breaking_the_contract_is_refused_before_any_rank(tmp_path, capsys, batch, loss, needle):
    path = tmp_path / "mine.py"
    path.write_text(WORKLOAD.replace("{BATCH}", batch).replace("{LOSS}", loss))
    out = tmp_path / "r.jsonl"
    refused(capsys, ["run", "--model", str(path), *FAST, "--out", str(out)], rf"--model='.*mine\.py': {needle}", out)


@pytest.mark.parametrize("old, new, name", [
    ("def make_batch(model, batch_size, image_size, seq_len, generator):", "def make_batch(model, batch_size):",
     "make_batch"),
    ("def loss(model, batch):", "def loss(batch):", "loss"),
])
def test_a_workload_function_that_cannot_take_the_harness_arguments_is_refused(tmp_path, capsys, old, new, name):
    path = tmp_path / "mine.py"
    path.write_text(WORKLOAD.replace("{BATCH}", GOOD_BATCH).replace("{LOSS}", GOOD_LOSS).replace(old, new))
    out = tmp_path / "r.jsonl"
    refused(capsys, ["run", "--model", str(path), *FAST, "--out", str(out)],
            rf"{name} cannot be called as {name}\(.*\); a workload defines build_model", out)


def test_a_good_workload_passes_the_dry_batch_and_reports_its_size():
    assert model_spec.check(EXAMPLE)["parameters"] == 19_818  # examples/my_model.py's defaults, built on meta
    assert model_spec.check(EXAMPLE, "width=8,depth=1")["parameters"] == 322


def test_user_code_that_cannot_run_on_the_meta_device_is_left_to_the_ranks(tmp_path):
    # A model whose build reads values cannot be checked on the meta device: not a reason to refuse it.
    path = tmp_path / "reads_values.py"
    path.write_text(WORKLOAD.replace("{BATCH}", GOOD_BATCH).replace("{LOSS}", GOOD_LOSS).replace(
        "    return nn.Linear(4, 2)", "    layer = nn.Linear(4, 2)\n    layer.weight.data.mul_(float(layer.weight.detach().abs().max()))\n"
                                     "    return layer"))
    assert model_spec.check(str(path))["parameters"] is None
