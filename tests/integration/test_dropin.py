"""ddp_core is a drop-in for torch.nn.parallel.DistributedDataParallel beyond the plain training step (issue 16).

Every check runs the same model and inputs once under ddp_core and once under PyTorch's DDP, on 2 ranks
(Gloo, real processes): either both give the same gradients, or both refuse with the same kind of error.
All checks share one launch; each records its outcome, so that one failure does not hide the others.
"""
import copy
import dataclasses
import io
import typing

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as TorchDDP
from torch.utils.checkpoint import checkpoint

from ddp_core import DistributedDataParallel
from experiments.measure.launch import run_ranks
from tests.tiny_models import build, make_batch
from tests.unit.test_dropin import annotated_hook


IMPLS = {"ddp_core": DistributedDataParallel, "torch": TorchDDP}


class Checkpointed(nn.Module):
    """`first`, then `second` checkpointed `times` times (the same layer recomputed in each backward)."""

    def __init__(self, times=1, reentrant=True, share_weight=False):
        super().__init__()
        torch.manual_seed(7)
        self.first, self.second = nn.Linear(6, 6), nn.Linear(6, 6)
        if share_weight:  # one parameter used by a plain layer and a checkpointed one
            self.first.weight = self.second.weight
        self.times, self.reentrant = times, reentrant

    def forward(self, x):
        x = torch.tanh(self.first(x))
        for _ in range(self.times):
            x = checkpoint(self.second, x, use_reentrant=self.reentrant)
        return x


class SparseEmbedding(nn.Module):
    """A sparse-gradient embedding bag feeding a dense head."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(8)
        self.embedding = nn.Embedding(20, 4, sparse=True)
        self.head = nn.Linear(4, 3)

    def forward(self, ids):
        return self.head(self.embedding(ids).mean(dim=1))


Aux = typing.NamedTuple("Aux", [("hidden", torch.Tensor), ("extra", list)])


@dataclasses.dataclass
class Output:
    logits: torch.Tensor
    aux: Aux


class DataclassOutput(nn.Module):
    """Returns a dataclass holding a namedtuple holding a list; `unused` takes no part."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(9)
        self.a, self.b, self.unused = nn.Linear(6, 6), nn.Linear(6, 3), nn.Linear(6, 3)

    def forward(self, x):
        hidden = torch.relu(self.a(x))
        return Output(self.b(hidden), Aux(hidden, [hidden.sum(dim=1)]))


class Ignoring(nn.Module):
    """`local` (a layer) and `counter` (a buffer) are to be ignored by DDP."""

    def __init__(self, rank):
        super().__init__()
        torch.manual_seed(10)
        self.shared, self.local = nn.Linear(6, 6), nn.Linear(6, 3)
        self.register_buffer("counter", torch.zeros(1))
        with torch.no_grad():  # different on each rank: ignored ones must stay so
            self.local.weight.add_(rank)
            self.counter.fill_(rank)

    def forward(self, x):
        self.counter += 1
        return self.local(torch.relu(self.shared(x)))


def _x(rank, step, cols=6):
    return torch.randn(4, cols, generator=torch.Generator().manual_seed(100 * step + rank))


def _grads(model: nn.Module) -> dict:
    """Every parameter's gradient (dense), or None."""
    return {n: None if p.grad is None else p.grad.detach().to_dense().clone() for n, p in model.named_parameters()}


def forward_without_backward(wrap, rank):
    """An output thrown away, a forward that raised, then two forwards under one backward (BatchNorm)."""
    model = wrap(build("cnn_bn"))
    batch = make_batch("cnn_bn", rank, 0)
    model(batch["x"])  # an evaluation pass in train mode: its output gets no backward
    with pytest.raises(RuntimeError):
        model(batch["x"][:, :2])  # a forward that raised (wrong number of channels)
    model(batch["x"]).sum().backward()
    first = _grads(model.module)
    model.zero_grad()
    second_batch = make_batch("cnn_bn", rank, 1)
    (model(batch["x"]).sum() + model(second_batch["x"]).square().mean()).backward()
    buffers = {n: b.clone() for n, b in model.module.named_buffers()}
    return {"first": first, "both": _grads(model.module), "buffers": buffers}


def sparse_gradients(wrap, rank, **kwargs):
    """Two SGD steps on an embedding with sparse gradients (a hook, if given, as `hook`)."""
    hook = kwargs.pop("hook", None)
    model = wrap(SparseEmbedding(), **kwargs)
    if hook is not None:
        model.register_comm_hook(None, hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    out = []
    for step in range(2):
        ids = torch.randint(0, 20, (4, 3), generator=torch.Generator().manual_seed(10 * step + rank))
        opt.zero_grad()
        model(ids).square().sum().backward()
        out.append(_grads(model.module))
        opt.step()
    return out


def train_steps(model_fn, steps=3, **kwargs):
    """`steps` of SGD with momentum on `model_fn()`'s output; the gradients of each step."""
    def run(wrap, rank):
        model = wrap(model_fn(rank), **kwargs)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        out = []
        for step in range(steps):
            opt.zero_grad()
            model(_x(rank, step)).square().mean().backward()
            out.append(_grads(model.module))
            opt.step()
        return out
    return run


class Branchy(nn.Module):
    """The branch used depends on the rank, and `never` is unused everywhere (same graph every iteration)."""

    def __init__(self, rank):
        super().__init__()
        self.inner = build("branchy")
        self.rank = rank

    def forward(self, x):
        return self.inner(x, route=self.rank % 2)


class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.p = nn.Parameter(torch.tensor([1.5, -0.5]))

    def forward(self, x):
        return (self.p * x).pow(2).sum()


def create_graph(wrap, rank, **kwargs):
    """backward(create_graph=True) three times, gradients accumulating (and needing grad themselves)."""
    model = wrap(Scaled(), **kwargs)
    out = []
    for step in range(3):
        model(_x(rank, step, cols=2)[0]).backward(create_graph=True)
        grad = model.module.p.grad
        out.append({"grad": grad.detach().clone(), "needs_grad": torch.tensor(grad.requires_grad)})
    return out


def sparse_create_graph(wrap, rank, **kwargs):
    """backward(create_graph=True) through an embedding with sparse gradients, twice, accumulating; beside
    it, the same steps without DDP on every rank's ids, averaged: what the gradients must be."""
    def ids(step, of_rank):
        return torch.randint(0, 20, (4, 3), generator=torch.Generator().manual_seed(10 * step + of_rank))

    model = wrap(SparseEmbedding(), **kwargs)
    out = []
    for step in range(2):
        model(ids(step, rank)).square().sum().backward(create_graph=True)
        out.append(_grads(model.module))
    expected = {}
    for other in range(dist.get_world_size()):
        local = SparseEmbedding()
        for step in range(2):
            local(ids(step, other)).square().sum().backward(create_graph=True)
        for name, grad in _grads(local).items():
            expected[name] = expected.get(name, 0) + grad / dist.get_world_size()
    return {"steps": out, "local_average": expected}


def dataclass_outputs(wrap, rank):
    """find_unused_parameters must see the tensors inside a dataclass holding a namedtuple."""
    model = wrap(DataclassOutput(), find_unused_parameters=True)
    out = []
    for step in range(2):
        model.zero_grad()
        result = model(_x(rank, step))
        (result.logits.square().mean() + result.aux.extra[0].mean()).backward()
        out.append(_grads(model.module))
    return out


def pickling(wrap, rank):
    """A deep copy and a torch.save/torch.load round trip of a trained wrapper both train on."""
    torch.manual_seed(12)
    model = wrap(nn.Sequential(nn.Linear(6, 6), nn.ReLU(), nn.Linear(6, 3)))
    model(_x(rank, 0)).sum().backward()
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    out = {}
    for name, other in (("deepcopy", copy.deepcopy(model)), ("loaded", torch.load(buffer, weights_only=False))):
        other.zero_grad()
        other(_x(rank, 1)).square().sum().backward()
        out[name] = _grads(other.module)
    return out


def bad_hook_bucket(state, bucket: int) -> torch.futures.Future[torch.Tensor]:
    return default_hooks.allreduce_hook(state, bucket)


def bad_hook_return(state, bucket: dist.GradBucket) -> int:
    return default_hooks.allreduce_hook(state, bucket)


def hook_returning_a_tensor(state, bucket):
    return bucket.buffer()


def hook_registration(wrap, rank, hook):
    """Register `hook` (twice if `hook` is annotated_hook) and train a step."""
    torch.manual_seed(13)
    model = wrap(nn.Linear(6, 3))
    model.register_comm_hook(None, hook)
    if hook is annotated_hook:
        model.register_comm_hook(None, hook)
    model(_x(rank, 0)).sum().backward()
    return _grads(model.module)


def ignored(wrap, rank, via_attribute=False):
    """Ignored parameters and buffers are neither broadcast nor averaged."""
    module = Ignoring(rank)
    names = ["local.weight", "local.bias", "counter"]
    if via_attribute:
        module._ddp_params_and_buffers_to_ignore = names
    else:
        wrap._set_params_and_buffers_to_ignore_for_model(module, names)
    model = wrap(module)
    model(_x(rank, 0)).square().mean().backward()
    return {"grads": _grads(module), "local.weight": module.local.weight.detach().clone(), "counter": module.counter.clone()}


def different_models(wrap, rank):
    wrap(nn.Linear(4, 4 + rank))


CHECKS = {
    # item: (function, keyword arguments, what PyTorch's DDP does: "ok" or the error it raises)
    "forward_without_backward": (forward_without_backward, {}, "ok"),
    "sparse": (sparse_gradients, {}, "ok"),
    "sparse_bucket_view": (sparse_gradients, {"gradient_as_bucket_view": True}, "ok"),
    "sparse_hook": (sparse_gradients, {"hook": default_hooks.allreduce_hook}, "ok"),
    "sparse_static_graph": (sparse_gradients, {"static_graph": True}, "ok"),
    # PyTorch's DDP fails here (its reducer writes into the gradient in place, which autograd refuses
    # for a gradient that has a graph); ddp_core is held to training without DDP instead.
    "sparse_create_graph": (sparse_create_graph, {}, RuntimeError),
    "sparse_create_graph_static": (sparse_create_graph, {"static_graph": True}, RuntimeError),
    "static_checkpoint_twice": (train_steps(lambda r: Checkpointed(times=2), static_graph=True), {}, "ok"),
    "static_shared_weight": (train_steps(lambda r: Checkpointed(share_weight=True), static_graph=True), {}, "ok"),
    "static_unused": (train_steps(Branchy, static_graph=True), {}, "ok"),
    "checkpoint_once_reentrant": (train_steps(lambda r: Checkpointed()), {}, "ok"),
    "checkpoint_once_non_reentrant": (train_steps(lambda r: Checkpointed(reentrant=False)), {}, "ok"),
    "checkpoint_twice_non_reentrant": (train_steps(lambda r: Checkpointed(times=2, reentrant=False)), {}, "ok"),
    "checkpoint_twice_reentrant": (train_steps(lambda r: Checkpointed(times=2)), {}, RuntimeError),
    "create_graph": (create_graph, {}, "ok"),
    "create_graph_bucket_view": (create_graph, {"gradient_as_bucket_view": True}, "ok"),
    "create_graph_static": (create_graph, {"static_graph": True}, "ok"),
    "dataclass_outputs": (dataclass_outputs, {}, "ok"),
    "pickling": (pickling, {}, "ok"),
    "hook_not_callable": (hook_registration, {"hook": "allreduce"}, TypeError),
    "hook_bucket_annotation": (hook_registration, {"hook": bad_hook_bucket}, ValueError),
    "hook_return_annotation": (hook_registration, {"hook": bad_hook_return}, ValueError),
    "hook_registered_twice": (hook_registration, {"hook": annotated_hook}, RuntimeError),
    "hook_returns_no_future": (hook_registration, {"hook": hook_returning_a_tensor}, RuntimeError),
    "ignored_parameters": (ignored, {}, "ok"),
    "no_trainable_parameters": (lambda wrap, rank: wrap(nn.Linear(2, 2).requires_grad_(False)), {}, RuntimeError),
}


def run_checks(rank, world_size, names=tuple(CHECKS)):
    """Each check under each implementation: ("ok", result) or ("error", exception class names, message)."""
    outcomes = {}
    for name in names:
        fn, kwargs, _ = CHECKS[name]
        for impl, wrap in IMPLS.items():
            try:
                outcomes[(name, impl)] = ("ok", fn(wrap, rank, **kwargs))
            except Exception as e:  # noqa: BLE001 - the outcome is what is compared
                outcomes[(name, impl)] = ("error", [c.__name__ for c in type(e).__mro__], str(e))
    extra = {}  # ddp_core only: the module attribute alone, without the static method
    extra["ignored_via_attribute"] = ignored(DistributedDataParallel, rank, via_attribute=True)
    # ddp_core only, and last: PyTorch's DDP refuses different models only on the ranks whose model
    # differs from rank 0's, and rank 0 then waits in its next collective, so it cannot run here.
    try:
        different_models(DistributedDataParallel, rank)
        extra["different_models"] = None
    except Exception as e:  # noqa: BLE001
        extra["different_models"] = ([c.__name__ for c in type(e).__mro__], str(e))
    return outcomes, extra


@pytest.fixture(scope="module")
def outcomes():
    return run_ranks(run_checks, 2, timeout=150)


def _same(ours, theirs, where):
    """Tensors (in nested dicts and lists) equal within float tolerance; None where the other has None."""
    if isinstance(theirs, dict):
        assert ours.keys() == theirs.keys(), where
        for key in theirs:
            _same(ours[key], theirs[key], f"{where}.{key}")
    elif isinstance(theirs, (list, tuple)):
        assert len(ours) == len(theirs), where
        for i, (a, b) in enumerate(zip(ours, theirs)):
            _same(a, b, f"{where}[{i}]")
    elif theirs is None or ours is None:
        assert ours is None and theirs is None, f"{where}: a gradient on one side only"
    else:
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6, msg=lambda m: f"{where}: {m}")


def _check(outcomes, name):
    expected = CHECKS[name][2]
    for rank, (rank_outcomes, _) in enumerate(outcomes):
        ours, theirs = rank_outcomes[(name, "ddp_core")], rank_outcomes[(name, "torch")]
        if expected == "ok":
            assert theirs[0] == "ok", f"PyTorch's DDP itself failed on rank {rank}: {theirs}"
            assert ours[0] == "ok", f"ddp_core failed on rank {rank} where PyTorch works: {ours[1][0]}: {ours[2]}"
            _same(ours[1], theirs[1], f"{name} rank {rank}")
        else:
            assert theirs[0] == "error" and expected.__name__ in theirs[1], f"PyTorch's DDP did not refuse: {theirs}"
            assert ours[0] == "error", f"ddp_core did not refuse on rank {rank} where PyTorch does ({theirs[2][:200]})"
            assert expected.__name__ in ours[1], f"ddp_core raised {ours[1][0]}, PyTorch {theirs[1][0]}: {ours[2]}"
    return [o[(name, "ddp_core")] for o, _ in outcomes]


T = pytest.mark.timeout(200)


@T
def test_forward_without_backward_then_two_forwards_one_backward(outcomes):
    _check(outcomes, "forward_without_backward")


@T
@pytest.mark.parametrize("variant", ["sparse", "sparse_bucket_view", "sparse_hook", "sparse_static_graph"])
def test_sparse_gradients_are_reduced_as_sparse_tensors(outcomes, variant):
    _check(outcomes, variant)


@T
@pytest.mark.parametrize("variant", ["static_checkpoint_twice", "static_shared_weight", "static_unused"])
def test_static_graph(outcomes, variant):
    _check(outcomes, variant)


@T
@pytest.mark.parametrize("variant", ["checkpoint_once_reentrant", "checkpoint_once_non_reentrant",
                                     "checkpoint_twice_non_reentrant"])
def test_activation_checkpointing(outcomes, variant):
    _check(outcomes, variant)


@T
def test_reentrant_checkpoint_twice_is_refused_for_the_reason_pytorch_gives(outcomes):
    for _, _, message in _check(outcomes, "checkpoint_twice_reentrant"):
        assert "Expected to mark a variable ready only once" in message, message
        assert "received no gradient" not in message, message


@T
@pytest.mark.parametrize("variant", ["create_graph", "create_graph_static"])
def test_backward_with_create_graph(outcomes, variant):
    _check(outcomes, variant)


@T
def test_create_graph_with_bucket_views_gives_pytorchs_values_without_a_graph(outcomes):
    """The one documented difference (docs/ddp_core.md): PyTorch's .grad, a bucket view, keeps the local
    gradient's graph through its copy (scaled by 1/world size, not synchronised); ddp_core's bucket views
    are made without autograd, so its .grad holds the same averaged values and no graph."""
    for rank, (rank_outcomes, _) in enumerate(outcomes):
        ours, theirs = (rank_outcomes[("create_graph_bucket_view", impl)] for impl in ("ddp_core", "torch"))
        assert ours[0] == theirs[0] == "ok", (ours, theirs)
        _same([s["grad"] for s in ours[1]], [s["grad"] for s in theirs[1]], f"rank {rank}")
        assert [bool(s["needs_grad"]) for s in theirs[1]] == [True] * 3
        assert [bool(s["needs_grad"]) for s in ours[1]] == [False] * 3


@T
@pytest.mark.parametrize("variant", ["sparse_create_graph", "sparse_create_graph_static"])
def test_sparse_gradients_with_create_graph_equal_training_without_ddp(outcomes, variant):
    for rank, (rank_outcomes, _) in enumerate(outcomes):
        theirs = rank_outcomes[(variant, "torch")]
        assert theirs[0] == "error" and "in-place" in theirs[2], f"PyTorch's DDP changed here: {theirs}"
        ours = rank_outcomes[(variant, "ddp_core")]
        assert ours[0] == "ok", f"ddp_core failed on rank {rank}: {ours[1][0]}: {ours[2]}"
        _same(ours[1]["steps"][-1], ours[1]["local_average"], f"{variant} rank {rank}")
        assert not torch.equal(ours[1]["steps"][0]["embedding.weight"], ours[1]["steps"][-1]["embedding.weight"])


@T
def test_outputs_inside_dataclasses_and_namedtuples(outcomes):
    _check(outcomes, "dataclass_outputs")


@T
def test_deepcopy_and_torch_save_load(outcomes):
    _check(outcomes, "pickling")


@T
@pytest.mark.parametrize("variant", ["hook_not_callable", "hook_bucket_annotation", "hook_return_annotation",
                                     "hook_registered_twice", "hook_returns_no_future"])
def test_comm_hook_validation(outcomes, variant):
    results = _check(outcomes, variant)
    if variant == "hook_returns_no_future":
        assert all("hook_returning_a_tensor" in message for _, _, message in results), results


@T
def test_refusals_are_runtime_errors(outcomes):
    _check(outcomes, "no_trainable_parameters")
    for _, extra in outcomes:
        assert extra["different_models"] is not None, "different models on the ranks were accepted"
        assert "RuntimeError" in extra["different_models"][0], extra["different_models"]


@T
def test_ignored_parameters_and_buffers(outcomes):
    _check(outcomes, "ignored_parameters")
    for rank, (rank_outcomes, extra) in enumerate(outcomes):
        result = rank_outcomes[("ignored_parameters", "ddp_core")][1]
        assert result["counter"].item() == rank + 1, "an ignored buffer was broadcast"
        rank_0 = outcomes[0][0][("ignored_parameters", "ddp_core")][1]
        torch.testing.assert_close(result["local.weight"], rank_0["local.weight"] + rank, msg="an ignored parameter was broadcast")
        _same(extra["ignored_via_attribute"], result, f"the module attribute alone, rank {rank}")
