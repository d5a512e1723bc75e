"""`ddpbench atlas`: every variant runs, interleaved round by round, in PyTorch's DDP with its own options;
blocks follow memory; the tables and the figure come out; bad input is refused before any process starts."""
import csv

import pytest

from ddp_core import auto_bucket
from experiments.atlas import plan, runner
from experiments.cli import main
from experiments.core.records import read_records

OPTIONS = [v for v in plan.VARIANTS if v != plan.DEFAULT]
MAIN_OPTIONS = [v for v in OPTIONS if v not in plan.OWN_BLOCK]


def _memory_for(model: str, replicas: float) -> float:
    """--memory-gb that holds `replicas` replicas of a quick model on the atlas's ranks."""
    config = plan.variant_config(plan.QUICK_MODELS[model], plan.DEFAULT, "none", 3, 3)
    return replicas * plan.parameters(config) * plan.BYTES_PER_PARAMETER * plan.WORLD_SIZE / 2**30


@pytest.fixture
def no_ranks(monkeypatch):
    """Fail the test if any rank process is started."""
    def refuse(*args, **kwargs):
        raise AssertionError("a rank pool was started for input that should have been refused")

    monkeypatch.setattr(runner, "RankPool", refuse)


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


def test_records_already_there_need_resume(tmp_path, capsys, no_ranks):
    (tmp_path / runner.RECORDS).write_text('{"schema_version": 2, "kind": "run"}\n')
    assert main(["atlas", "--quick", "--out", str(tmp_path)]) == 2
    assert "already holds records" in capsys.readouterr().err


def test_blocks_follow_memory_and_compile_gets_its_own():
    models = {"bert-tiny": plan.QUICK_MODELS["bert-tiny"]}
    whole = plan.plan(models, [plan.DEFAULT, *OPTIONS], ["none"], 3, 3, memory_gb=1.0)
    assert [b.name for b in whole] == ["main", "compile"]
    assert list(whole[0].configs) == [plan.DEFAULT, *MAIN_OPTIONS]
    assert list(whole[1].configs) == [plan.DEFAULT, "compile"]
    # room for 5 replicas: 11 options in 3 blocks of the default and 4, 4 and 3 options, every option once
    split = plan.plan(models, [plan.DEFAULT, *OPTIONS], ["none"], 3, 3, memory_gb=_memory_for("bert-tiny", 5.5))
    assert [b.name for b in split] == ["main-1", "main-2", "main-3", "compile"]
    assert all(list(b.configs)[0] == plan.DEFAULT for b in split[:3])
    assert [len(b.configs) for b in split[:3]] == [5, 5, 4]
    assert sorted(v for b in split for v in b.configs if v != plan.DEFAULT) == sorted(OPTIONS)
    for block in split:
        for variant, config in block.configs.items():  # PyTorch's DDP with the variant's options, nothing else
            # PyTorch's DDP with the variant's options, but for ddp_core's own variants
            assert config.impl == ("ddp_core" if variant in ("ddp_core", "bucket_auto") else "torch")
            assert config.world_size == 2 and config.seed == 0
            expected = {**plan.expected_options(plan.variant_config(models["bert-tiny"], plan.DEFAULT, "none", 3, 3)),
                        **{"find_unused": {"find_unused_parameters": True}, "static_graph": {"static_graph": True},
                           "bucket_view": {"gradient_as_bucket_view": True}, "fp16_hook": {"comm_hook": "fp16_compress_hook"},
                           "bf16_hook": {"comm_hook": "bf16_compress_hook"},
                           "powersgd": {"comm_hook": "powerSGD_hook", "powersgd_rank": plan.POWERSGD_RANK},
                           "compile": {"compiled": True}, "bucket_1mb": {"bucket_cap_mb": 1.0},
                           "bucket_5mb": {"bucket_cap_mb": 5.0}, "bucket_100mb": {"bucket_cap_mb": 100.0},
                           "ddp_core": {"impl": "ddp_core"}, "bucket_auto": {"impl": "ddp_core", "bucket_cap_mb": "auto"},
                           plan.DEFAULT: {}}[variant]}
            assert plan.expected_options(config) == expected


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
                assert chosen_at in (auto_bucket.DECIDE_AT, auto_bucket.DECIDE_AT + auto_bucket.SEARCH_ITERATIONS)
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


def test_atlas_cells_are_corrected_for_multiple_comparisons_by_benjamini_hochberg(tmp_path):
    # 40 models x (the default, one option of no effect), 3 of them also with an option 20% slower; paired rounds of
    # 20 iterations: of the 40 null cells some exclude 1 at 95% by chance; after the correction over the network's
    # 43 cells none is marked, while every real one stays. (Seeded: the draw is the same every run.)
    import numpy as np

    from experiments.atlas import tables
    from experiments.core.records import append_record

    rng = np.random.default_rng(4)
    records = tmp_path / "records.jsonl"
    for m in range(40):
        session = f"s{m}"
        for variant, factor in (("default", 1.0), ("static_graph", 1.0), ("powersgd", 1.2))[:3 if m < 3 else 2]:
            latency = (0.1 * factor * np.exp(0.05 * rng.standard_normal(20))).tolist()
            append_record(records, {"kind": "run", "status": "ok", "config": {"link": "none"}, "latency_s": latency,
                                    "atlas": {"model": f"m{m}", "variant": variant, "session": session,
                                              "block": "main"}})
    rows = tables.rows(records)
    null = [r for r in rows if r["option"] == "static_graph"]
    assert sum(r["excludes_1"] for r in null) >= 1  # what marking every interval excluding 1 would call a difference
    assert not any(r["significant"] for r in null)
    assert all(r["significant"] for r in rows if r["option"] == "powersgd")
    assert all(r["q_bh"] >= r["p"] for r in rows)
    assert "**" not in tables.cell(null[0])


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
