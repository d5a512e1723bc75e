"""The DDP behaviours that PyTorch's test/distributed/test_c10d_gloo.py checks, as the project's own tests
(issue 31). That file does not ship with torch; docs/ddp_core.md maps each of its DDP tests to a test here,
to an older project test, or to the reason it does not apply.

Every check runs the same model and inputs under ddp_core and under PyTorch's DDP on 2 Gloo ranks (real
processes, one launch for all checks): both must give the same gradients or parameters, or both refuse
with the same reason. Most checks also train the same model without DDP on the whole global batch, and
hold both DDPs to it, as PyTorch's tests hold theirs.
"""
import copy
import dataclasses
import itertools
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present
from torch.nn.parallel import DistributedDataParallel as TorchDDP
from torch.utils.checkpoint import checkpoint

from ddp_core import DistributedDataParallel
from experiments.measure.launch import run_ranks

IMPLS = {"ddp_core": DistributedDataParallel, "torch": TorchDDP}
READY_TWICE = "Expected to mark a variable ready only once"


# --- models ---

class ThreeLayers(nn.Module):
    """Bias-free linear layers and a softmax head; `use_last=False` leaves `c` out of the graph."""

    def __init__(self, widths=(2, 10, 12, 4), last=True):
        super().__init__()
        self.a, self.b = nn.Linear(widths[0], widths[1], bias=False), nn.Linear(widths[1], widths[2], bias=False)
        self.c = nn.Linear(widths[2], widths[3], bias=False) if last else None
        self.d = nn.Linear(widths[3], widths[3], bias=False) if not last else None  # never used

    def forward(self, x, use_last=True):
        x = torch.relu(self.b(torch.relu(self.a(x)).float()))
        if self.c is not None and use_last:
            x = self.c(x)
        return F.softmax(x, dim=1)


class Offset(nn.Module):
    """A 2x2 parameter added to the input."""

    def __init__(self):
        super().__init__()
        self.p = nn.Parameter(torch.ones(2, 2))

    def forward(self, x):
        return self.p + x


class Tasks(nn.Module):
    """Three `Offset` tasks; `route` picks which ones a rank uses (`t2` is used by no rank)."""

    def __init__(self, route):
        super().__init__()
        self.t0, self.t1, self.t2 = Offset(), Offset(), Offset()
        self.route = route

    def forward(self, x, rank):
        if self.route == "one_task_per_rank":
            return self.t0(x) if rank == 0 else self.t1(x)
        return self.t1(self.t0(x)) if rank == 0 else self.t1(x)  # rank 0 uses every task but t2


class Checkpointing(nn.Module):
    """Two 6x6 layers, checkpointed in the patterns of PyTorch's checkpointing tests.

    once: `a`, then `b` checkpointed; twice: `b` checkpointed twice; alternate: one of `a`, `b`
    checkpointed per forward, alternating (a graph that changes every iteration). `shared` ties the
    two weights together.
    """

    def __init__(self, pattern, reentrant, shared=False):
        super().__init__()
        self.a, self.b = nn.Linear(6, 6), nn.Linear(6, 6)
        if shared:
            self.a.weight = self.b.weight
        self.pattern, self.reentrant, self.calls = pattern, reentrant, 0

    def forward(self, x):
        if self.pattern == "alternate":
            self.calls += 1
            return checkpoint(self.b if self.calls % 2 else self.a, x, use_reentrant=self.reentrant)
        x = self.a(x)
        for _ in range(2 if self.pattern == "twice" else 1):
            x = checkpoint(self.b, x, use_reentrant=self.reentrant)
        return x


@dataclasses.dataclass
class Outputs:
    first: torch.Tensor | None
    second: dict


class DataclassOutputs(nn.Module):
    """Returns a dataclass whose first field may be None (then `first` is unused) and whose second is a dict."""

    def __init__(self, skip_first):
        super().__init__()
        self.first = nn.Sequential(nn.Linear(6, 6), nn.Linear(6, 6))
        self.second = nn.Sequential(nn.Linear(6, 6), nn.Linear(6, 6))
        self.skip_first = skip_first

    def forward(self, x):
        first = None if self.skip_first else torch.relu(self.first(x))
        return Outputs(first, {"plain": self.second(x), "relu": torch.relu(self.second(x))})


# --- helpers ---

def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _grads(model):
    """Every parameter's gradient (dense), or None, by name."""
    return {n: None if p.grad is None else p.grad.detach().to_dense().clone() for n, p in model.named_parameters()}


def _params(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _share(tensor, rank):
    """This rank's equal share of a global batch (along the first dimension)."""
    return tensor.chunk(dist.get_world_size())[rank]


# --- what runs on each rank: each check returns tensors to compare, or raises ---

def against_local_training(wrap, rank, gradient_as_bucket_view=False):
    """Two steps of `p -= p.grad` with tiny buckets; DDP on this rank's share, a plain copy on the whole
    batch (reshuffled between steps); `.grad` is reset to None after each step."""
    torch.manual_seed(21)
    local = ThreeLayers()
    model = wrap(copy.deepcopy(local), bucket_cap_mb=0.001, gradient_as_bucket_view=gradient_as_bucket_view)
    world = dist.get_world_size()
    x, y = torch.randn(2 * world, 2, generator=_gen(1)), torch.randn(2 * world, 4, generator=_gen(2))
    out = []
    for step in range(2):
        F.mse_loss(local(x), y).backward()
        F.mse_loss(model(_share(x, rank)), _share(y, rank)).backward()
        for module in (local, model.module):
            with torch.no_grad():
                for p in module.parameters():
                    p -= p.grad
                    p.grad = None
        out.append({"ddp": _params(model.module), "local": _params(local)})
        order = torch.randperm(2 * world, generator=_gen(3 + step))
        x, y = x[order], y[order]
    return out


def unused_on_some_ranks(wrap, rank, route, **kwargs):
    """Tasks used by one rank only, and one used by none: which gradients exist, and their values."""
    model = wrap(Tasks(route), find_unused_parameters=True, **kwargs)
    out = []
    for step in range(2):
        model.zero_grad(set_to_none=True)
        output = model(torch.full((2, 2), 8.0 + step), rank)
        before = [p.grad is None for p in model.parameters()]
        output.mean().backward()
        out.append({"none_before": before, "grads": _grads(model.module)})
    return out


def ignored_outputs(wrap, rank, unused=False):
    """Four forwards whose outputs are dropped, then four trained ones (gradients accumulate)."""
    torch.manual_seed(22)
    model = wrap(ThreeLayers(last=not unused), find_unused_parameters=unused)
    x = torch.rand(4, 2, generator=_gen(10 + rank))
    target = torch.randint(0, 4, (4,), generator=_gen(20 + rank))
    for _ in range(4):
        output = model(x)
        del output
    out = []
    for _ in range(4):
        F.cross_entropy(model(x), target).backward()
        out.append(_grads(model.module))
    return out


def resume_from_state_dict(wrap, rank, directory):
    """Three SGD steps, rank 0 saves the wrapper's state_dict, every rank zeroes its parameters and loads it
    (into the wrapper, and without the "module." prefix into a plain copy), then three more steps; beside
    it, six uninterrupted steps. The inputs are equal on every rank, so the plain copy must follow too."""
    torch.manual_seed(23)
    base = ThreeLayers()
    resumed, plain, straight = wrap(copy.deepcopy(base)), copy.deepcopy(base), wrap(copy.deepcopy(base))
    x, target = torch.rand(4, 2, generator=_gen(30)), torch.randint(0, 4, (4,), generator=_gen(31))

    def train(model, steps):
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        for _ in range(steps):
            opt.zero_grad()
            F.cross_entropy(model(x), target).backward()
            opt.step()

    train(resumed, 3)
    path = Path(directory) / f"{wrap.__module__}.pt"
    if rank == 0:
        torch.save(resumed.state_dict(), path)
    dist.barrier()
    state = torch.load(path)
    for model in (resumed, plain):
        with torch.no_grad():
            for p in model.parameters():
                p.zero_()
    resumed.load_state_dict(state)
    keys = sorted(state)
    consume_prefix_in_state_dict_if_present(state, "module.")
    plain.load_state_dict(state)
    train(resumed, 3)
    train(plain, 3)
    train(straight, 6)
    return {"keys": keys, "resumed": _params(resumed.module), "plain": _params(plain),
            "straight": _params(straight.module)}


def hook_future_value(wrap, rank):
    """A comm hook whose future resolves to ones, then adds one in a `then` callback: the gradients must be
    that value (2), whatever the local gradients were."""
    def hook(state, bucket):
        future = torch.futures.Future()
        future.set_result(torch.ones_like(bucket.buffer()))
        return future.then(lambda f: f.value() + 1)

    model = wrap(Offset())
    model.register_comm_hook(None, hook)
    model(torch.full((2, 2), 8.0 + rank)).mean().backward()
    return _grads(model.module)


def checkpointed(wrap, rank, pattern, reentrant, view=False, static=False, unused=False, shared=False,
                 around=False):
    """Five iterations of a checkpointed model (`around`: the whole DDP forward inside one reentrant or
    non-reentrant checkpoint, with `a` and `b` sharing a weight), DDP on this rank's share of the batch,
    a plain copy on the whole batch; the gradients of both each iteration."""
    torch.manual_seed(31)
    if around:
        a, b = nn.Linear(6, 6), nn.Linear(6, 6)
        a.weight = b.weight
        local = nn.Sequential(a, b)
    else:
        local = Checkpointing(pattern, reentrant, shared)
    model = wrap(copy.deepcopy(local), bucket_cap_mb=1, gradient_as_bucket_view=view, static_graph=static,
                 find_unused_parameters=unused)
    static_logged = model._get_ddp_logging_data().get("static_graph", 0)
    world = dist.get_world_size()
    x = torch.rand(4 * world, 6, generator=_gen(40)).requires_grad_()
    y = torch.randn(4 * world, 6, generator=_gen(41))
    out = []
    for _ in range(5):
        for m, inputs, target in ((local, x, y), (model, _share(x, rank), _share(y, rank))):
            m.zero_grad(set_to_none=False)
            output = checkpoint(m, inputs, use_reentrant=reentrant) if around else m(inputs)
            F.mse_loss(output, target).backward()
        out.append({"ddp": _grads(model.module), "local": _grads(local)})
    return {"static_graph_logged": static_logged, "steps": out}


def dataclass_outputs(wrap, rank, skip_first):
    """One backward through a dataclass output holding None or a tensor, and a dict of tensors."""
    torch.manual_seed(0)
    local = DataclassOutputs(skip_first)
    model = wrap(copy.deepcopy(local), find_unused_parameters=True)
    world = dist.get_world_size()
    x = torch.cat([torch.full((4, 6), float(r)) for r in range(world)])

    def loss(out):
        total = out.second["plain"] + out.second["relu"] + (0 if out.first is None else out.first)
        return F.mse_loss(total, torch.ones_like(total))

    loss(local(x)).backward()
    loss(model(_share(x, rank))).backward()
    return {"ddp": _grads(model.module), "local": _grads(local)}


def mixed_dtypes(wrap, rank, unused_first=False):
    """A model whose first layer is float64, the rest float32; three Adam steps. `unused_first`: the last
    layer takes no part in the first iteration only (find_unused_parameters)."""
    torch.manual_seed(24)
    module = ThreeLayers()
    module.a.double()
    model = wrap(module, find_unused_parameters=unused_first)
    opt = torch.optim.Adam(model.parameters())
    out = []
    for step in range(3):
        opt.zero_grad()
        x = torch.rand(5, 2, dtype=torch.double, generator=_gen(50 + 10 * step + rank))
        target = torch.randint(0, 4, (5,), generator=_gen(51 + 10 * step + rank))
        F.cross_entropy(model(x, use_last=not unused_first or step > 0), target).backward()
        out.append(_grads(model.module))
        opt.step()
    return out


# --- the checks: name -> (function, keyword arguments, PyTorch's DDP outcome: "ok" or a message part) ---

CHECKS = {
    "cpu_module": (against_local_training, {}, "ok"),
    "cpu_module_view": (against_local_training, {"gradient_as_bucket_view": True}, "ok"),
    "global_local_unused": (unused_on_some_ranks, {"route": "one_task_per_rank"}, "ok"),
    "global_local_unused_view": (unused_on_some_ranks,
                                 {"route": "one_task_per_rank", "gradient_as_bucket_view": True}, "ok"),
    "global_local_unused_static": (unused_on_some_ranks, {"route": "one_task_per_rank", "static_graph": True}, "ok"),
    "unused_empty_on_rank_0": (unused_on_some_ranks, {"route": "all_on_rank_0"}, "ok"),
    "ignored_output": (ignored_outputs, {}, "ok"),
    "ignored_output_unused": (ignored_outputs, {"unused": True}, "ok"),
    "resume_from_state_dict": (resume_from_state_dict, {}, "ok"),
    "hook_future_value": (hook_future_value, {}, "ok"),
    "dataclass_output": (dataclass_outputs, {"skip_first": False}, "ok"),
    "dataclass_output_unused": (dataclass_outputs, {"skip_first": True}, "ok"),
    "mixed_dtypes": (mixed_dtypes, {}, "ok"),
    "mixed_dtypes_unused_first": (mixed_dtypes, {"unused_first": True}, "ok"),
}

def _checkpointing_runs() -> dict:
    """PyTorch's checkpointing tests (test_c10d_common.py, inherited by test_c10d_gloo.py): test -> runs,
    each (keyword arguments of `checkpointed`, PyTorch's outcome). A reentrant checkpoint hides its layer
    from the unused-parameter search and from the once-per-iteration count, so those runs fail without a
    static graph."""
    runs = {}

    def add(test, expected="ok", **kwargs):
        runs.setdefault(test, []).append((kwargs, expected))

    for r, view in itertools.product((True, False), (False, True)):
        fails = READY_TWICE if r else "ok"
        for static in (False, True):
            add(f"once[{r}]", pattern="once", reentrant=r, view=view, static=static)
            add(f"weight_sharing[{r}]", pattern=None, around=True, reentrant=r, view=view, static=static)
        add(f"once[{r}]", pattern="once", reentrant=r, view=view, static=True, unused=True)
        add(f"unused_params[{r}]", fails, pattern="once", reentrant=r, view=view, unused=True)
        add(f"unused_params[{r}]", pattern="once", reentrant=r, view=view, unused=True, static=True)
        add(f"twice[{r}]", fails, pattern="twice", reentrant=r, view=view)
        add(f"twice[{r}]", fails, pattern="twice", reentrant=r, view=view, unused=True)
        add(f"twice_static_graph[{r}]", pattern="twice", reentrant=r, view=view, static=True)
    for view in (False, True):  # PyTorch runs these with one kind of checkpoint only
        add("twice_weight_sharing", pattern="twice", shared=True, reentrant=True, view=view, static=True)
        add("dynamic_module", pattern="alternate", reentrant=False, view=view, unused=True)
        add("dynamic_weight_sharing", pattern="alternate", shared=True, reentrant=False, view=view, unused=True)
    return runs


CHECKPOINTING = _checkpointing_runs()
for _test, _runs in CHECKPOINTING.items():
    for _i, (_kwargs, _expected) in enumerate(_runs):
        CHECKS[f"checkpointing_{_test}_{_i}"] = (checkpointed, _kwargs, _expected)


def run_checks(rank, world_size, directory):
    """Each check under each implementation: ("ok", result) or ("error", exception class names, message)."""
    outcomes = {}
    for name, (fn, kwargs, _) in CHECKS.items():
        kwargs = {**kwargs, "directory": directory} if fn is resume_from_state_dict else kwargs
        for impl, wrap in IMPLS.items():
            try:
                outcomes[(name, impl)] = ("ok", fn(wrap, rank, **kwargs))
            except Exception as e:  # noqa: BLE001 - the outcome is what is compared
                outcomes[(name, impl)] = ("error", [c.__name__ for c in type(e).__mro__], str(e))
    return outcomes


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    return run_ranks(run_checks, 2, args=(str(tmp_path_factory.mktemp("c10d_gloo")),), timeout=150)


# --- comparing ---

def _same(ours, theirs, where, rtol=1e-5, atol=1e-6):
    """Equal within float tolerance, through nested dicts and lists; None only where the other has None."""
    if isinstance(theirs, dict):
        assert ours.keys() == theirs.keys(), where
        for key in theirs:
            _same(ours[key], theirs[key], f"{where}.{key}", rtol, atol)
    elif isinstance(theirs, (list, tuple)):
        assert len(ours) == len(theirs), where
        for i, (a, b) in enumerate(zip(ours, theirs)):
            _same(a, b, f"{where}[{i}]", rtol, atol)
    elif isinstance(theirs, torch.Tensor) and isinstance(ours, torch.Tensor):
        torch.testing.assert_close(ours, theirs, rtol=rtol, atol=atol, msg=lambda m: f"{where}: {m}")
    else:
        assert ours == theirs, f"{where}: {ours!r} against {theirs!r}"


def _check(outcomes, name):
    """Both implementations as CHECKS says PyTorch's does: equal results, or the same refusal; ddp_core's results."""
    expected = CHECKS[name][2]
    results = []
    for rank, rank_outcomes in enumerate(outcomes):
        ours, theirs = rank_outcomes[(name, "ddp_core")], rank_outcomes[(name, "torch")]
        if expected == "ok":
            assert theirs[0] == "ok", f"{name}: PyTorch's DDP itself failed on rank {rank}: {theirs}"
            assert ours[0] == "ok", f"{name}: ddp_core failed on rank {rank} where PyTorch works: {ours[1:]}"
            _same(ours[1], theirs[1], f"{name} rank {rank}")
            results.append(ours[1])
        else:
            assert theirs[0] == "error" and expected in theirs[2], f"{name}: PyTorch's DDP changed: {theirs}"
            assert ours[0] == "error", f"{name}: ddp_core did not refuse on rank {rank} where PyTorch does"
            assert theirs[1][0] in ours[1] and expected in ours[2], f"{name}: ddp_core: {ours[1][0]}: {ours[2]}"
    return results


def _like_local(result, where, rtol=1.3e-6, atol=5e-5):
    """DDP's figures equal those of the plain model trained on the whole batch (PyTorch's tolerances)."""
    for i, step in enumerate(result if isinstance(result, list) else [result]):
        _same(step["ddp"], step["local"], f"{where} step {i}", rtol, atol)


T = pytest.mark.timeout(200)


@T
@pytest.mark.parametrize("variant", ["cpu_module", "cpu_module_view"])
def test_gloo_backend_cpu_module_trains_as_one_process(outcomes, variant):
    for rank, result in enumerate(_check(outcomes, variant)):
        _like_local(result, f"{variant} rank {rank}")


@T
@pytest.mark.parametrize("variant", ["global_local_unused", "global_local_unused_view", "global_local_unused_static"])
def test_globally_unused_stay_none_locally_unused_get_gradients(outcomes, variant):
    for result in _check(outcomes, variant):
        for step in result:
            assert all(step["none_before"])
            grads = step["grads"]
            assert grads["t0.p"] is not None and grads["t1.p"] is not None and grads["t2.p"] is None, grads


@T
def test_find_unused_parameters_when_one_rank_uses_all(outcomes):
    for result in _check(outcomes, "unused_empty_on_rank_0"):
        assert all(result[-1]["grads"][f"t{i}.p"] is not None for i in (0, 1))


@T
@pytest.mark.parametrize("variant", ["ignored_output", "ignored_output_unused"])
def test_outputs_may_be_ignored(outcomes, variant):
    for result in _check(outcomes, variant):
        if variant == "ignored_output_unused":
            assert all(step["d.weight"] is None for step in result)


@T
def test_state_dict_checkpoint_resumes_training(outcomes):
    for result in _check(outcomes, "resume_from_state_dict"):
        assert all(key.startswith("module.") for key in result["keys"]), result["keys"]
        _same(result["resumed"], result["straight"], "resumed against uninterrupted")
        _same(result["plain"], result["straight"], "plain copy against uninterrupted")


@T
def test_comm_hook_future_value_becomes_the_gradient(outcomes):
    for result in _check(outcomes, "hook_future_value"):
        torch.testing.assert_close(result["p"], torch.full((2, 2), 2.0))


@T
@pytest.mark.parametrize("variant", ["dataclass_output", "dataclass_output_unused"])
def test_dataclass_output(outcomes, variant):
    for rank, result in enumerate(_check(outcomes, variant)):
        _like_local(result, f"{variant} rank {rank}")
        if variant == "dataclass_output_unused":
            assert all(g is None for n, g in result["ddp"].items() if n.startswith("first."))


@T
@pytest.mark.parametrize("variant", ["mixed_dtypes", "mixed_dtypes_unused_first"])
def test_mixed_dtype_model(outcomes, variant):
    for result in _check(outcomes, variant):
        assert result[0]["a.weight"].dtype == torch.float64
        if variant == "mixed_dtypes_unused_first":  # globally unused in the first iteration only
            assert result[0]["c.weight"] is None and result[1]["c.weight"] is not None


@T
@pytest.mark.parametrize("test", list(CHECKPOINTING))
def test_ddp_checkpointing(outcomes, test):
    for i, (kwargs, expected) in enumerate(CHECKPOINTING[test]):
        name = f"checkpointing_{test}_{i}"
        for rank, result in enumerate(_check(outcomes, name)):
            assert result["static_graph_logged"] == kwargs.get("static", False), name
            _like_local(result["steps"], f"{name} {kwargs} rank {rank}")
            if kwargs.get("pattern") != "alternate":  # a graph that changes leaves some gradients None
                assert all(g is not None for step in result["steps"] for g in step["ddp"].values()), name
