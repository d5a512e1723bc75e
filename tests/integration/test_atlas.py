"""`ddpbench atlas`: every variant runs, interleaved round by round, in PyTorch's DDP with its own options;
blocks follow memory; the tables and the figure come out; bad input is refused before any process starts."""
import csv

import pytest

from ddp_core import auto_bucket
from experiments.atlas import plan, runner
from experiments.cli import main
from experiments.core.records import read_records
from tests.unit.test_atlas import MAIN_OPTIONS, _memory_for
from tests.unit.test_atlas import no_ranks  # noqa: F401,F811  (fixtures: pytest finds them by name)


@pytest.mark.parametrize("argv, needle", [
    (["--models", "resnet18,resnet99"], "--models='resnet18,resnet99': 'resnet99' is not allowed; choose from resnet18"),
    (["--variants", "static_graph,fp8_hook"], "--variants='static_graph,fp8_hook': 'fp8_hook' is not allowed"),
    (["--rounds", "2"], "--rounds=2 is not allowed; it must be >= 3"),
    (["--warmup", "1"], "--warmup=1 is not allowed; it must be >= 3 (PowerSGD"),
    (["--links", "none,fast"], "--links='none,fast': --link='fast' is not allowed"),
    (["--memory-gb", "1e-6"], "--memory-gb=1e-06 is too little for resnet-tiny"),
    (["--memory-gb", "nan"], "--memory-gb=nan is not allowed"),
    (["--timeout", "0"], "--timeout=0.0 is not allowed"),
    (["--tables-only"], "--tables-only: --out="),
])
def test_bad_input_is_refused_before_any_process_starts(argv, needle, tmp_path, capsys, no_ranks):
    out = tmp_path / "atlas"
    assert main(["atlas", "--quick", "--out", str(out), *argv]) == 2
    assert needle in capsys.readouterr().err
    assert not (out / runner.RECORDS).exists()


def _compiled_options(rank, world_size, fields):
    from experiments.atlas.interleave import observe
    from experiments.core.config import RunConfig
    from experiments.measure.harness import build

    return observe(build(rank, RunConfig(**fields)).ddp)  # torch.compile is lazy: nothing is compiled here


@pytest.mark.timeout(120)
def test_the_compiled_variant_is_pytorchs_ddp_under_torch_compile():
    from experiments.measure.launch import run_ranks

    config = plan.variant_config(plan.QUICK_MODELS["bert-tiny"], "compile", "none", 3, 3)
    seen = run_ranks(_compiled_options, 1, (config.__dict__,))[0]
    seen.pop("hook_iterations")
    assert seen.pop("auto_bucket") is None
    assert seen == plan.expected_options(config) and seen["compiled"]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_quick_atlas_interleaves_every_variant_with_its_options(tmp_path, capsys):
    out = tmp_path / "atlas"
    rounds = 3
    # room for 7 replicas: the 11 options run in 2 blocks, each with its own default
    assert main(["atlas", "--quick", "--models", "bert-tiny", "--variants", ",".join(MAIN_OPTIONS), "--rounds",
                 str(rounds), "--memory-gb", f"{_memory_for('bert-tiny', 7.5)!r}", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "2 blocks ok, 0 failed" in printed
    records = read_records(out / runner.RECORDS)
    assert all(r["status"] == "ok" for r in records)
    by_block = {}
    for record in records:
        by_block.setdefault(record["atlas"]["session"], []).append(record)
    assert len(by_block) == 2
    measured = sorted(r["atlas"]["variant"] for r in records if r["atlas"]["variant"] != plan.DEFAULT)
    assert measured == sorted(MAIN_OPTIONS)
    for block in by_block.values():
        assert block[0]["atlas"]["variant"] == plan.DEFAULT
        # each round ran every variant once, in an order of its own
        orders = [sorted(range(len(block)), key=lambda v: block[v]["atlas"]["positions"][r]) for r in range(rounds)]
        assert all(sorted(order) == list(range(len(block))) for order in orders)
        assert len({tuple(order) for order in orders}) > 1
        for record in block:
            assert len(record["latency_s"]) == rounds and all(x > 0 for x in record["latency_s"])
            observed = dict(record["atlas"]["observed"])
            # the DDP module reports exactly the options of its variant (as the C++ reducer was told)
            iterations, auto = observed.pop("hook_iterations"), observed.pop("auto_bucket")
            config = plan.variant_config(plan.QUICK_MODELS["bert-tiny"], record["atlas"]["variant"], "none", rounds,
                                         plan.QUICK["warmup"])
            assert observed == plan.expected_options(config)
            if record["atlas"]["variant"] == "powersgd":  # the hook ran in every iteration, not only registered
                assert iterations == plan.QUICK["warmup"] + rounds
            if record["atlas"]["variant"] == "bucket_auto":  # it chose, in iterations of its own before warm-up
                assert auto["auto_bucket_state"] == "chosen" and auto["auto_bucket_cap_mb"] > 0
                # up to and including the forward that chose, after the measured search (or the model alone
                # where the model has a single layout to offer)
                chosen_at = auto["auto_bucket_decided_after_iterations"] + 1
                assert len(record["atlas"]["tuning_s"]) == chosen_at <= auto_bucket.BUDGET
                assert chosen_at - auto_bucket.DECIDE_AT in (0, *auto_bucket.SEARCH_STOPS)
            else:
                assert auto is None and "tuning_s" not in record["atlas"]
    with open(out / "atlas.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert sorted(r["option"] for r in rows) == sorted(MAIN_OPTIONS)
    assert all(float(r["ci_low"]) <= float(r["ratio"]) <= float(r["ci_high"]) for r in rows)
    table = (out / "atlas.md").read_text()
    assert "| model | default p50 (ms) | find_unused | static_graph |" in table and "| bert-tiny |" in table
    assert f"commit {records[0]['env']['git_commit'][:12]}" in table  # the commit measured, not the one now
    assert (out / "atlas.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the tables are rebuilt from the records alone
    (out / "atlas.csv").unlink()
    assert main(["atlas", "--tables-only", "--out", str(out)]) == 0
    assert (out / "atlas.csv").exists()


DEPTHWISE_MODEL = '''"""A depthwise convolution of a channels-last input, as ConvNeXt's blocks have (their LayerNorm
permutes): the gradient of its weight [C, 1, k, k] comes out channels-last, its strides differing from the
weight's in the size-1 dimension."""
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, classes):
        super().__init__()
        self.depthwise = nn.Conv2d(3, 3, 7, padding=3, groups=3)
        self.head = nn.Linear(3, classes)

    def forward(self, x):
        x = x.contiguous(memory_format=torch.channels_last)
        return self.head(self.depthwise(x).permute(0, 2, 3, 1)).mean(dim=(1, 2))


def build_model(classes: int = 3) -> nn.Module:
    return Block(classes)


def make_batch(model, batch_size, image_size, seq_len, generator):
    return {"images": torch.randn(batch_size, 3, image_size, image_size, generator=generator),
            "labels": torch.randint(0, 3, (batch_size,), generator=generator)}


def loss(model, batch):
    return nn.functional.cross_entropy(model(batch["images"]), batch["labels"])
'''


@pytest.mark.timeout(120)
def test_the_bucket_view_variant_does_not_print_ddps_grad_strides_warning(tmp_path, capfd):
    # DDP warns "Grad strides do not match bucket view strides" for a depthwise convolution's weight under
    # gradient_as_bucket_view (ConvNeXt in the atlas): the strides differ in a size-1 dimension only.
    import dataclasses

    from experiments.atlas.interleave import measure_block
    from experiments.measure.configs import resolve_grid
    from experiments.measure.launch import run_ranks

    (tmp_path / "depthwise.py").write_text(DEPTHWISE_MODEL)
    model = plan.Model(str(tmp_path / "depthwise.py"), image_size=8, batch_size=2)
    variants = {}
    for variant in (plan.DEFAULT, "bucket_view"):
        config = dataclasses.replace(plan.variant_config(model, variant, "none", 3, 3), world_size=1)
        fields = {k: [x] for k, x in dataclasses.asdict(config).items() if k not in plan.HARDWARE}
        variants[variant] = dataclasses.asdict(resolve_grid(fields)[0])
    measured = run_ranks(measure_block, 1, (variants, "strides"))[0]
    assert measured["bucket_view"]["observed"]["gradient_as_bucket_view"]
    err = capfd.readouterr().err
    assert "Grad strides do not match" not in err, err
