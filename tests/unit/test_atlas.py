"""`ddpbench atlas`: every variant runs, interleaved round by round, in PyTorch's DDP with its own options;
blocks follow memory; the tables and the figure come out; bad input is refused before any process starts."""

import pytest

from experiments.atlas import plan, runner
from experiments.cli import main

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
