"""Peak memory per rank: the instrument against allocations of known size, then a `run` record of a model
that allocates a known amount per iteration, then the figure where users read it."""
import pytest

from experiments.core.records import load_records, read_records
from experiments.measure.configs import expand_grid
from experiments.measure.sweep import run_sweep, summary_line


ALLOCATING_MODEL = '''
import torch
from torch import nn


def build_model(extra_mb: int = 0):
    model = nn.Linear(8, 2)
    model.extra_mb = extra_mb
    return model


def make_batch(model, batch_size, image_size, seq_len, generator):
    return {"x": torch.randn(batch_size, 8, generator=generator)}


def loss(model, batch):
    # a known allocation in every forward, written so that it is resident, freed at the end of the iteration
    extra = torch.ones(getattr(model, "module", model).extra_mb * 2**20 // 4, device=batch["x"].device)
    return model(batch["x"]).sum() + 0 * extra[:1].sum()
'''


def test_a_run_record_holds_each_ranks_peak_and_it_sees_a_known_allocation(tmp_path):
    model = tmp_path / "allocating.py"
    model.write_text(ALLOCATING_MODEL)
    configs = expand_grid({"model": [str(model)], "model_config": ["extra_mb=0", "extra_mb=300"], "world_size": [2],
                           "iters": [3], "warmup": [1], "threads": [1], "batch_size": [2]})
    out = tmp_path / "records.jsonl"
    lines = []
    assert run_sweep(configs, out, echo=lines.append)["ok"] == 2
    records = {r["config"]["model_config"]: r for r in read_records(out)}
    none, extra = records["extra_mb=0"]["memory"], records["extra_mb=300"]["memory"]
    assert none["method"] == extra["method"] == "hwm"
    assert len(extra["peak_mb_per_rank"]) == 2 and extra["peak_mb"] == max(extra["peak_mb_per_rank"])
    # the same processes measured both configs (a pool): the peak is the config's own, not the process's
    for rank in range(2):
        grown = extra["peak_mb_per_rank"][rank] - none["peak_mb_per_rank"][rank]
        assert grown == pytest.approx(300, rel=0.1), (rank, grown)
    assert "peak" in summary_line(records["extra_mb=300"]) and "MB/rank" in summary_line(records["extra_mb=300"])
    frame = load_records(out)
    assert frame["peak_memory_mb"].tolist() == [records[c]["memory"]["peak_mb"] for c in frame["model_config"]]
