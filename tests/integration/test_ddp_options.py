"""DDP's own options as grid parameters of `run`, for ddp_core and PyTorch's DDP alike: parsed as lists,
refused up front where an implementation cannot run them, recorded in the config, and handed to DDP."""

import pytest

from experiments.cli import main
from experiments.core.config import RunConfig
from experiments.core.records import read_records
from experiments.measure.launch import RankPool, run_ranks


UNUSED_MODEL = '''
import torch
from torch import nn


class TwoHeads(nn.Module):
    def __init__(self):
        super().__init__()
        self.used, self.unused = nn.Linear(8, 4), nn.Linear(8, 4)

    def forward(self, x):
        return self.used(x)


def build_model():
    return TwoHeads()


def make_batch(model, batch_size, image_size, seq_len, generator):
    return {"x": torch.randn(batch_size, 8, generator=generator)}


def loss(model, batch):
    return model(batch["x"]).pow(2).mean()
'''


def _wrapped(rank, world_size, fields):
    from experiments.measure.harness import build

    config = RunConfig(**fields)
    trainee = build(rank, config)
    inner = getattr(trainee.ddp, "_orig_mod", trainee.ddp)
    losses = []
    for _ in range(3):
        value = trainee.family.loss(trainee.ddp, trainee.batch)
        value.backward()
        trainee.optimizer.step()
        trainee.optimizer.zero_grad()
        losses.append(float(value))
    hook = getattr(getattr(inner, "reducer", None), "comm_hook", None)  # (ddp_core's; PyTorch's is in C++)
    return {"static_graph": bool(inner.static_graph), "find_unused": bool(inner.find_unused_parameters),
            "bucket_view": bool(inner.gradient_as_bucket_view), "compiled": inner is not trainee.ddp,
            "losses": losses, "hook": getattr(hook, "__name__", repr(hook))}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("impl", ["torch", "ddp_core"])
def test_the_options_reach_both_implementations(impl):
    fields = RunConfig(model="bert-tiny", seq_len=8, batch_size=2, world_size=2, impl=impl, static_graph=True,
                       find_unused_parameters=True, bucket_view=True).__dict__
    for result in run_ranks(_wrapped, 2, (fields,)):
        assert result["static_graph"] and result["find_unused"] and result["bucket_view"]
        assert not result["compiled"]


def _parameters_after_steps(rank, world_size, configs):
    """Train each config's DDP model 3 steps in these processes; its parameters, flattened, per config."""
    import torch

    from experiments.measure.harness import build

    trained = []
    for fields in configs:
        trainee = build(rank, RunConfig(**fields))
        for _ in range(3):
            trainee.family.loss(trainee.ddp, trainee.batch).backward()
            trainee.optimizer.step()
            trainee.optimizer.zero_grad()
        trained.append(torch.cat([p.detach().reshape(-1) for p in trainee.model.parameters()]))
    return trained


@pytest.mark.timeout(300)
def test_each_ddp_option_trains_ddp_core_as_pytorchs_ddp_at_two_ranks():
    """Through the grid's own path (harness.build), every DDP option of `run` gives ddp_core the parameters
    it gives PyTorch's DDP after 3 steps at world size 2 (compile: at one rank, in the test below)."""
    import torch

    base = {**RunConfig(model="bert-tiny", seq_len=8, batch_size=2, world_size=2).__dict__, "bucket_mb": 0.05}
    options = {"find_unused_parameters": {"find_unused_parameters": True}, "static_graph": {"static_graph": True},
               "bucket_view": {"bucket_view": True}, "fp16": {"comm_hook": "fp16"},
               "powersgd": {"comm_hook": "powersgd", "powersgd_rank": 2}}
    configs = [{**base, **option, "impl": impl} for option in options.values() for impl in ("torch", "ddp_core")]
    per_rank = run_ranks(_parameters_after_steps, 2, (configs,), timeout=240)
    for trained in per_rank:
        for index, name in enumerate(options):
            torch_ddp, ddp_core = trained[2 * index], trained[2 * index + 1]
            torch.testing.assert_close(ddp_core, torch_ddp, rtol=1e-5, atol=1e-6, msg=lambda m: f"{name}: {m}")
        # the hooks really compressed: their parameters are not those of plain all-reduce
        plain = trained[0]
        assert not torch.equal(trained[6], plain) and not torch.equal(trained[8], plain)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_compile_and_powersgd_train_as_without_them():
    base = RunConfig(model="resnet-tiny", image_size=16, batch_size=2, world_size=1, impl="ddp_core").__dict__
    with RankPool(1, timeout=240) as pool:  # one rank for the four runs, as a sweep's configs share theirs
        plain, compiled, torch_compiled, powersgd = (pool.run(_wrapped, (fields,), timeout=240)[0] for fields in (
            base, {**base, "compile": "default"}, {**base, "impl": "torch", "compile": "default"},
            {**base, "comm_hook": "powersgd", "powersgd_rank": 2}))
    assert compiled["compiled"]
    # Inductor's kernels round differently from eager ones: the first loss agrees closely; later ones drift
    # apart (batch-norm at batch 2 amplifies it), so the trajectory is held against PyTorch's DDP compiled.
    assert compiled["losses"][0] == pytest.approx(plain["losses"][0], rel=1e-3)
    assert compiled["losses"] == pytest.approx(torch_compiled["losses"], rel=1e-5)
    # PowerSGD at one rank: compression of a sum over one rank is exact after its first (plain) iterations
    assert powersgd["hook"] == "powerSGD_hook"  # registered, not silently left out
    assert powersgd["losses"][0] == pytest.approx(plain["losses"][0], rel=1e-5)


@pytest.mark.timeout(300)
def test_a_model_with_unused_parameters_is_told_the_option_that_runs_it(tmp_path):
    model = tmp_path / "two_heads.py"
    model.write_text(UNUSED_MODEL)
    out = tmp_path / "r.jsonl"
    common = ["run", "--model", str(model), "--world-size", "2", "--iters", "2", "--warmup", "1", "--impl",
              "ddp_core,torch", "--out", str(out), "--timeout", "120"]
    assert main(common) == 1
    failed = [r for r in read_records(out) if r["status"] == "failed"]
    assert len(failed) == 2 and all("--find-unused-parameters true" in r["error"] for r in failed)
    assert main([*common, "--find-unused-parameters", "true"]) == 0
    ok = [r for r in read_records(out) if r["status"] == "ok"]
    assert len(ok) == 2 and all(r["config"]["find_unused_parameters"] is True for r in ok)


@pytest.mark.timeout(300)
def test_powersgd_over_gloo_with_several_buckets_runs_on_both_implementations(tmp_path):
    # PowerSGD issues its second all-reduce from a callback; unordered, the ranks' collectives crossed
    # buckets and Gloo hung or failed with a size mismatch (harness.in_bucket_order keeps them in order).
    out = tmp_path / "r.jsonl"
    assert main(["run", "--model", "resnet-tiny", "--image-size", "16", "--batch-size", "2", "--world-size", "2",
                 "--impl", "torch,ddp_core", "--comm-hook", "powersgd", "--powersgd-rank", "2", "--bucket-mb", "0.5",
                 "--iters", "6", "--warmup", "3", "--timeout", "120", "--out", str(out)]) == 0
    records = read_records(out)
    assert len(records) == 2 and all(r["status"] == "ok" and r["correct"] for r in records)
    assert all(len(r["buckets"][0] or {}) > 1 for r in records if r["config"]["impl"] == "ddp_core")  # several buckets
