"""Uneven inputs (issue 31): ranks with 3, 5 and 8 batches train inside `model.join()` under ddp_core and
under PyTorch's DDP (Gloo, 3 real processes); both end with the same parameters on every rank, within a
timeout (no hang), and equal to a single-process replay of the same averaged steps."""
import pytest
import torch
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as TorchDDP

from ddp_core import DistributedDataParallel
from experiments.measure.launch import run_ranks

IMPLS = {"ddp_core": DistributedDataParallel, "torch": TorchDDP}
BATCHES = [3, 5, 8]  # per rank


class Net(nn.Module):
    """Linear -> BatchNorm (buffers synchronised under join) -> Linear; `spare` is used by rank 0 only."""

    def __init__(self, norm=True, spare=False):
        super().__init__()
        torch.manual_seed(21)
        self.a, self.b = nn.Linear(5, 6), nn.Linear(6, 2)
        self.spare = nn.Linear(6, 2) if spare else None
        self.norm = nn.BatchNorm1d(6) if norm else nn.Identity()

    def forward(self, x, use_spare=False):
        h = torch.relu(self.norm(self.a(x)))
        return self.b(h) + (self.spare(h) if use_spare else 0)


def _x(rank, step):
    return torch.randn(4, 5, generator=torch.Generator().manual_seed(1000 * rank + step))


VARIANTS = {  # name -> (Net kwargs, DDP kwargs, join kwargs, comm hook)
    "plain": ({"norm": False}, {}, {}, None),
    "batchnorm": ({}, {}, {}, None),
    "effective_world_size": ({}, {}, {"divide_by_initial_world_size": False}, None),
    "unused_parameters": ({"spare": True}, {"find_unused_parameters": True}, {}, None),
    "comm_hook": ({}, {"bucket_cap_mb": 0.0001}, {}, default_hooks.allreduce_hook),
    "bucket_views": ({}, {"gradient_as_bucket_view": True, "bucket_cap_mb": 0.0001}, {}, None),
}


def train_uneven(rank, world_size):
    """Each variant under each implementation; then throw_on_early_termination (last: it raises)."""
    out = {}
    for name, (net_kwargs, ddp_kwargs, join_kwargs, hook) in VARIANTS.items():
        for impl, wrap in IMPLS.items():
            model = wrap(Net(**net_kwargs), **ddp_kwargs)
            if hook is not None:
                model.register_comm_hook(None, hook)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            with model.join(**join_kwargs):
                for step in range(BATCHES[rank]):
                    opt.zero_grad()
                    model(_x(rank, step), use_spare=rank == 0 and "unused" in name).square().mean().backward()
                    opt.step()
            out[name, impl] = {n: t.detach().clone() for n, t in model.module.state_dict().items()}
    for impl, wrap in IMPLS.items():
        model = wrap(Net(norm=False))
        try:
            with model.join(throw_on_early_termination=True):
                for step in range(BATCHES[rank]):
                    model(_x(rank, step)).sum().backward()
            out["throw", impl] = None
        except RuntimeError as e:
            out["throw", impl] = str(e)
    return out


@pytest.fixture(scope="module")
def results():
    return run_ranks(train_uneven, len(BATCHES), timeout=150)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_join_ends_with_pytorchs_model_on_every_rank(results, variant):
    reference = results[0][variant, "ddp_core"]
    for rank, result in enumerate(results):
        for name, value in result[variant, "ddp_core"].items():
            torch.testing.assert_close(value, result[variant, "torch"][name], rtol=1e-5, atol=1e-6,
                                       msg=lambda m: f"rank {rank} {name}: ddp_core differs from PyTorch: {m}")
            torch.testing.assert_close(value, reference[name], rtol=0, atol=0,
                                       msg=lambda m: f"rank {rank} {name}: replicas differ: {m}")


@pytest.mark.timeout(200)
def test_join_equals_single_process_training(results):
    """Step t averages the gradients of the ranks that still have a batch, divided by the initial world size."""
    model = Net(norm=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(max(BATCHES)):
        opt.zero_grad()
        active = [rank for rank, n in enumerate(BATCHES) if step < n]
        loss = sum(model(_x(rank, step)).square().mean() for rank in active) / len(BATCHES)
        loss.backward()
        opt.step()
    for name, value in model.state_dict().items():
        torch.testing.assert_close(results[0]["plain", "ddp_core"][name], value, rtol=1e-5, atol=1e-6)


@pytest.mark.timeout(200)
def test_throw_on_early_termination_raises_on_every_rank_as_pytorch_does(results):
    for rank, result in enumerate(results):
        assert result["throw", "torch"] is not None, f"PyTorch's DDP did not raise on rank {rank}"
        assert result["throw", "ddp_core"] is not None, f"ddp_core did not raise on rank {rank}"
        assert ("exhausted" in result["throw", "ddp_core"]) == ("exhausted" in result["throw", "torch"])
