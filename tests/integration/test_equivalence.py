"""DDP must equal local training: after several optimizer steps every replica is bitwise equal to the
others and equal, within float tolerance, to single-process training (see tiny_models.train_locally)."""
import pytest
import torch

from ddp_core import DistributedDataParallel
from experiments.measure.launch import run_ranks
from tests.tiny_models import build, loss_of, make_batch, make_optimizer, train_locally

MODELS = ["cnn_bn", "bert", "frozen", "branchy"]
OPTIMIZERS = ["sgd", "adam"]
STEPS = 3


def train_with_ddp(rank, world_size):
    """On each rank: train every model with ddp_core; return final parameters and buffers."""
    out = {}
    for name in MODELS:
        for optimizer_kind in OPTIMIZERS:
            model = build(name)
            ddp = DistributedDataParallel(model, find_unused_parameters=name == "branchy", bucket_cap_mb=0.001)
            optimizer = make_optimizer(optimizer_kind, [p for p in ddp.parameters() if p.requires_grad])
            for step in range(STEPS):
                optimizer.zero_grad()
                loss_of(ddp, name, make_batch(name, rank, step)).backward()
                optimizer.step()
            ddp.eval()  # an evaluation forward: buffers are broadcast, running statistics left alone
            with torch.no_grad():
                loss_of(ddp, name, make_batch(name, rank, STEPS))
            out[name, optimizer_kind] = {
                "params": {k: v.detach().clone() for k, v in model.named_parameters()},
                "buffers": {k: v.clone() for k, v in model.named_buffers()},
            }
    return out


@pytest.fixture(scope="module", params=[2, 3], ids=lambda ws: f"world{ws}")
def trained(request):
    world_size = request.param
    return world_size, run_ranks(train_with_ddp, world_size, timeout=240)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("optimizer_kind", OPTIMIZERS)
@pytest.mark.parametrize("name", MODELS)
def test_replicas_equal_each_other_and_local_training(trained, name, optimizer_kind):
    world_size, per_rank = trained
    replicas = [r[name, optimizer_kind] for r in per_rank]
    for rank, replica in enumerate(replicas[1:], start=1):
        for key, value in replica["params"].items():
            assert torch.equal(value, replicas[0]["params"][key]), f"rank {rank} parameter {key} differs from rank 0"
    reference = train_locally(name, optimizer_kind, world_size, STEPS)
    moved = 0
    for key, expected in reference.named_parameters():
        actual = replicas[0]["params"][key]
        torch.testing.assert_close(actual, expected.detach(), rtol=1e-4, atol=1e-5, msg=lambda m: f"{key}: {m}")
        moved += not torch.equal(actual, build(name).state_dict()[key])
    assert moved > 0, "training did not change any parameter: the comparison would prove nothing"
    if name == "cnn_bn":
        assert replicas[0]["buffers"]["bn.num_batches_tracked"].item() == STEPS
    if name == "frozen":
        torch.testing.assert_close(replicas[0]["params"]["stem.weight"], build(name).stem.weight.detach())
    if name == "branchy":  # unused on every rank: never touched
        torch.testing.assert_close(replicas[0]["params"]["never.weight"], build(name).never.weight.detach())
