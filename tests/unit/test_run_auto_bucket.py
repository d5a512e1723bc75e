"""`run --bucket-mb auto`: ddp_core chooses its cap in iterations counted apart, the record says what it
chose and why, and the options that cannot choose a cap are refused before any rank starts."""

import pytest

from experiments.cli import main


@pytest.mark.parametrize("argv, needle", [
    (["--impl", "torch"], "--bucket-mb auto needs --impl ddp_core or ddp_core_no_overlap: PyTorch's DDP has no"),
    (["--impl", "ddp_core", "--comm-hook", "powersgd"], "--bucket-mb auto cannot go with --comm-hook powersgd"),
    (["--impl", "ddp_core", "--compile", "default"], "--bucket-mb auto needs --compile none"),
])
def test_options_that_cannot_choose_a_cap_are_refused_before_anything_runs(tmp_path, capsys, argv, needle):
    out = tmp_path / "records.jsonl"
    assert main(["run", "--bucket-mb", "auto", *argv, "--out", str(out)]) == 2
    assert needle in capsys.readouterr().err
    assert not out.exists()


def test_a_cap_that_is_neither_a_number_nor_auto_names_both(tmp_path, capsys):
    assert main(["run", "--bucket-mb", "25,sometimes", "--impl", "ddp_core", "--out", str(tmp_path / "r.jsonl")]) == 2
    assert "--bucket-mb: 'sometimes' is not a valid bucket cap (a number of MB, or auto)" in capsys.readouterr().err
