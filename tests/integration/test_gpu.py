"""CUDA paths: NCCL and Gloo on CUDA tensors give torch DDP's gradients; stream order is respected.

Marked `gpu`; skipped where CUDA is absent (conftest.py). Run them with `./run_tests.sh -m gpu`.
"""
import pytest
import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as TorchDDP

import ddp_core
from ddp_core import DistributedDataParallel
from experiments.measure.launch import run_ranks
from tests.tiny_models import build, loss_of, make_batch

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(300)]


def _on_device(batch, device):
    return {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}


def cuda_gradients_match(rank, world_size, side_stream):
    """Max relative gap between ddp_core and torch DDP gradients on CUDA, per variant."""
    device = torch.device("cuda", rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    variants = {
        "overlap": ({}, None),
        "no_overlap": ({"overlap": False}, None),
        "bucket_view": ({"gradient_as_bucket_view": True}, None),
        "fp16_hook": ({}, (ddp_core.fp16_compress_hook, default_hooks.fp16_compress_hook)),
        "no_sync": ({}, None),
    }
    gaps = {}
    for variant, (kwargs, hooks) in variants.items():
        ours, theirs = build("bert").to(device), build("bert").to(device)
        ddp = DistributedDataParallel(ours, device_ids=[device], bucket_cap_mb=0.002, **kwargs)
        ref = TorchDDP(theirs, device_ids=[device], gradient_as_bucket_view=kwargs.get("gradient_as_bucket_view", False))
        if hooks:
            ddp.register_comm_hook(None, hooks[0])
            ref.register_comm_hook(None, hooks[1])
        gap = 0.0
        for step in range(3):
            batch = _on_device(make_batch("bert", rank, step, size=16), device)
            for model in (ddp, ref):
                model.zero_grad()
                # Forward (hence backward) on a side stream: gradients are produced off the default
                # stream, so a missing stream wait before reading them would show up as wrong values.
                stream = torch.cuda.Stream() if side_stream else torch.cuda.current_stream()
                stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(stream):
                    if variant == "no_sync":
                        with model.no_sync():
                            loss_of(model, "bert", batch).backward()
                    loss_of(model, "bert", batch).backward()
                torch.cuda.current_stream().wait_stream(stream)
            torch.cuda.synchronize()
            for p, q in zip(ours.parameters(), theirs.parameters()):
                gap = max(gap, ((p.grad - q.grad).abs().max() / (q.grad.abs().max() + 1e-12)).item())
        gaps[variant] = gap
    return gaps


def _check(results):
    for rank_gaps in results:
        for variant, gap in rank_gaps.items():
            assert gap <= (2e-3 if "fp16" in variant else 1e-5), f"{variant}: relative gradient gap {gap:.2e}"


@pytest.mark.parametrize("side_stream", [False, True], ids=["default_stream", "side_stream"])
def test_nccl_matches_torch_ddp(side_stream):
    world_size = min(2, torch.cuda.device_count())
    _check(run_ranks(cuda_gradients_match, world_size, args=(side_stream,), backend="nccl", timeout=240))


def test_gloo_on_cuda_tensors_two_ranks_matches_torch_ddp():
    # Both ranks may share one GPU: Gloo, unlike NCCL, allows that.
    _check(run_ranks(cuda_gradients_match, 2, args=(True,), backend="gloo", timeout=240))

