"""ddp_core takes PyTorch's DDP constructor signature (issue 31): the same parameters in the same order
with the same defaults, ddp_core's own knobs keyword-only; the parameters it implements behave as
PyTorch's (2 Gloo ranks, side by side), the others are refused by name. Also: comm-hook registration
errors match PyTorch's messages, and the timing figures of `_get_ddp_logging_data`."""
import time
import warnings

import pytest
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as TorchDDP

from ddp_core import DistributedDataParallel
from experiments.measure.launch import run_ranks


IMPLS = {"ddp_core": DistributedDataParallel, "torch": TorchDDP}


TIMING = ["forward_compute_time", "backward_compute_time", "backward_comm_time",
          "backward_compute_comm_overlap_time"]


class Cached(nn.Module):
    """Returns the same tensor every forward (computed once): backward reuses its graph."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.lin = nn.Linear(3, 2)
        self.out = None

    def forward(self, x):
        if self.out is None:
            self.out = self.lin(x).sum()
        return self.out


class Sleepy(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 2)

    def forward(self, x):
        time.sleep(0.05)
        return self.lin(x)


def _bn_net():
    torch.manual_seed(5)
    return nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, 3), nn.Linear(3, 3))


def _x(rank, step=0):
    return torch.randn(6, 4, generator=torch.Generator().manual_seed(50 * rank + step))


def _train(model, rank, steps=2, **fwd):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        opt.zero_grad()
        model(_x(rank, step), **fwd).square().mean().backward()
        opt.step()
    return {n: t.detach().clone() for n, t in model.module.state_dict().items()}


def _error(fn):
    try:
        fn()
        return None
    except Exception as e:  # noqa: BLE001 - the outcome is compared
        return ([c.__name__ for c in type(e).__mro__], str(e))


def side_by_side(rank, world_size):
    """Each behaviour under both implementations."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    out = {}
    mesh = init_device_mesh("cpu", (world_size,))
    for impl, wrap in IMPLS.items():
        r = {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # positional, in PyTorch's order: module, device_ids, output_device, dim, broadcast_buffers,
            # init_sync, process_group
            r["positional"] = _train(wrap(_bn_net(), None, None, 0, True, True, dist.group.WORLD), rank)
            unsynced = _bn_net()
            with torch.no_grad():
                for p in unsynced.parameters():
                    p.add_(rank)
                unsynced[1].running_mean.fill_(rank)
            r["init_sync_false"] = {n: t.clone() for n, t in wrap(unsynced, init_sync=False).module.state_dict().items()}
            for kwargs in ({"broadcast_buffers": False}, {"forward_sync_buffers": False}):
                module = _bn_net()
                module[1].running_var.fill_(1 + rank)
                model = wrap(module, **kwargs)
                model(_x(rank))  # an eval-mode forward would not change the statistics: train mode it is
                r[str(kwargs)] = module[1].running_var.clone()
            r["mesh"] = _train(wrap(_bn_net(), device_mesh=mesh), rank)
            r["cap_list"] = _train(wrap(_bn_net(), bucket_cap_mb_list=[0.00005, 0.0001]), rank)
            r["output_device_on_cpu"] = _error(lambda: wrap(_bn_net(), output_device=1))
            r["output_device_0_on_cpu"] = _error(lambda: wrap(_bn_net(), output_device=0))
            r["mesh_and_group"] = _error(lambda: wrap(_bn_net(), process_group=dist.group.WORLD, device_mesh=mesh))
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                wrap(_bn_net(), check_reduction=True)
            r["check_reduction_warns"] = any(issubclass(w.category, FutureWarning) for w in caught)
            skip = wrap(_bn_net(), find_unused_parameters=True, skip_all_reduce_unused_params=True,
                        bucket_cap_mb=0.00003)
            model_fn = skip.module
            skip.module.forward = lambda x: model_fn[1](model_fn[0](x))  # the last two layers unused
            r["skip_unused"] = _train(skip, rank)
            data = skip._get_ddp_logging_data()
            r["skip_unused_reduced"] = (data["num_buckets_reduced"], len(data["bucket_sizes"].split(",")))
            cached = wrap(Cached())
            calls = []
            if impl == "ddp_core":
                original = cached.reducer._output_reached
                cached.reducer._output_reached = lambda g: (calls.append(1), original(g))[1]
            grads = []
            for step in range(3):
                cached.zero_grad()
                cached(_x(rank, step)[:, :3]).backward(retain_graph=True)
                grads.append(cached.module.lin.weight.grad.clone())
            r["cached"], r["cached_hook_calls"] = grads, len(calls)
            sleepy = wrap(Sleepy())
            for step in range(3):
                sleepy(_x(rank, step)[:, :3]).sum().backward()
            r["logging"] = sleepy._get_ddp_logging_data()
        out[impl] = r
    return out


@pytest.fixture(scope="module")
def results():
    return run_ranks(side_by_side, 2, timeout=150)


def _close(a, b, where):
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            _close(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list):
        for i, (x, y) in enumerate(zip(a, b)):
            _close(x, y, f"{where}[{i}]")
    else:
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=lambda m: f"{where}: {m}")


@pytest.mark.timeout(200)
@pytest.mark.parametrize("item", ["positional", "init_sync_false", "{'broadcast_buffers': False}",
                                  "{'forward_sync_buffers': False}", "mesh", "cap_list", "skip_unused", "cached"])
def test_implemented_parameters_behave_as_pytorchs(results, item):
    for rank, result in enumerate(results):
        _close(result["ddp_core"][item], result["torch"][item], f"rank {rank} {item}")


@pytest.mark.timeout(200)
def test_refusals_and_warnings_as_pytorch(results):
    for result in results:
        ours, theirs = result["ddp_core"], result["torch"]
        for item in ("output_device_on_cpu", "mesh_and_group"):
            assert theirs[item] is not None and ours[item] is not None, item
            assert theirs[item][0][0] in ours[item][0], (item, ours[item], theirs[item])
        assert ours["output_device_0_on_cpu"] is None and theirs["output_device_0_on_cpu"] is None
        assert ours["check_reduction_warns"] and theirs["check_reduction_warns"]
        # The layouts differ (ddp_core keeps its small first bucket), so the counts may: both leave out
        # the buckets of the unused layers.
        for reduced, buckets in (ours["skip_unused_reduced"], theirs["skip_unused_reduced"]):
            assert 0 < reduced < buckets


@pytest.mark.timeout(200)
def test_a_cached_output_does_not_pile_up_hooks(results):
    for result in results:
        assert result["ddp_core"]["cached_hook_calls"] == 3, "one output pre-hook call per backward"


@pytest.mark.timeout(200)
def test_logging_data_has_pytorchs_timing_figures(results):
    for result in results:
        ours, theirs = result["ddp_core"]["logging"], result["torch"]["logging"]
        for name in TIMING:
            for key in (name, f"avg_{name}"):
                assert key in theirs and key in ours, key
        for data in (ours, theirs):  # the module sleeps 50 ms in forward: both see it there
            assert data["forward_compute_time"] >= 50e6
            assert data["backward_compute_time"] < 50e6
            assert 0 <= data["backward_compute_comm_overlap_time"] <= data["backward_compute_time"]
        assert ours["num_buckets_reduced"] == theirs["num_buckets_reduced"]
