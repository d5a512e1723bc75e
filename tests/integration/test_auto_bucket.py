"""bucket_cap_mb="auto": the schedule model ranks and shortlists (unit tests of the pure functions), the
measured search decides among the shortlist, the same on every rank even when their timings differ, within
the budget, told by the logging data, and it leaves gradients exactly those of a fixed cap (PyTorch's DDP)
and of single-process training."""
import weakref

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel as TorchDDP

from ddp_core import DistributedDataParallel, auto_bucket, bucket_layout
from ddp_core.auto_bucket import AllReduceCost, choose_cap, predict
from experiments.measure.launch import RankPool
from tests.tiny_models import build, loss_of, make_batch, make_optimizer, train_locally


STEPS = auto_bucket.DECIDE_AT + auto_bucket.SEARCH_ITERATIONS + 3  # a few iterations on the chosen buckets


def _counted_rebucket(ddp):
    """Wrap the reducer's rebucket to note the synchronised iteration of each call."""
    calls, original = [], ddp.reducer.rebucket

    def rebucket(*args):
        calls.append(ddp.reducer.times.iterations)
        original(*args)

    ddp.reducer.rebucket = rebucket
    return calls


def _bytes_expensive(ddp):
    """Make the tuner see expensive bytes and gradients far apart (small buckets then hide them): a real switch."""
    own = ddp._auto.local_figures

    def figures():
        measured = own()
        position = {index: k for k, index in enumerate(ddp.reducer.order)}
        measured["ready"] = [(position[i] + 1) * 1e-2 for i in range(len(measured["ready"]))]
        measured["backward"] = len(measured["ready"]) * 1e-2
        measured["seconds"] = [size * 1e-5 for size in measured["sizes"]]
        # and measured the exposed communication these figures predict for its layout: a model that fits
        # the measured layout (its error sets the margin a switch must beat)
        r = ddp.reducer
        measured["exposed"], _ = predict(ddp._auto._specs(), r.order, measured["ready"], measured["backward"],
                                         AllReduceCost.fit(measured["sizes"], measured["seconds"]),
                                         r.bucket_cap_mb, r.first_bucket_cap_mb)
        return measured

    ddp._auto.local_figures = figures
    # and measured the model's best other layout (the shortlist's second) fastest, in every round
    ddp._auto.round_figures = lambda: {slot: [1.0, 0.5, 0.9][slot] for slot in ddp._auto._timed}


def train_auto_and_torch(rank, world_size, bucket_view):
    """ddp_core auto beside PyTorch's DDP (25 MB) on the same batches: gradients per step, the switch, memory."""
    name = "bert"
    ours, theirs = build(name), build(name)
    # Measured on 4 KB buckets rather than 25 MB, so that tiny BERT has several buckets to switch from.
    default_cap, auto_bucket.DEFAULT_CAP_MB = auto_bucket.DEFAULT_CAP_MB, 0.004
    ddp = DistributedDataParallel(ours, bucket_cap_mb="auto", gradient_as_bucket_view=bucket_view)
    auto_bucket.DEFAULT_CAP_MB = default_cap
    _bytes_expensive(ddp)
    ref = TorchDDP(theirs, bucket_cap_mb=25, gradient_as_bucket_view=bucket_view)
    calls = _counted_rebucket(ddp)
    live, peaks = weakref.WeakSet(), []  # the reducer's flat buffers alive, and their bytes at each creation

    class Tracked(bucket_layout.GradBucket):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            if self.flat is not None:
                live.add(self.flat)
            peaks.append(sum(f.numel() * f.element_size() for f in live))

    original = bucket_layout.GradBucket
    bucket_layout.GradBucket = Tracked  # (this rank's process only)
    opt_ours, opt_theirs = make_optimizer("sgd", ddp.parameters()), make_optimizer("sgd", ref.parameters())
    equal, layouts = [], []
    try:
        for step in range(STEPS):
            if step + 1 == auto_bucket.DECIDE_AT:
                peaks.clear()
            batch = make_batch(name, rank, step)
            for model, opt in ((ddp, opt_ours), (ref, opt_theirs)):
                opt.zero_grad(set_to_none=False)  # (with bucket views, .grad lives in the old buckets at the switch)
                loss_of(model, name, batch).backward()
            equal.append(all(torch.equal(p.grad, q.grad) for p, q in zip(ours.parameters(), theirs.parameters())))
            layouts.append(ddp.get_ddp_logging_data()["bucket_sizes"])
            opt_ours.step()
            opt_theirs.step()
    finally:
        bucket_layout.GradBucket = original
    data = ddp.get_ddp_logging_data()
    total = sum(p.numel() * p.element_size() for p in ours.parameters())
    return {"equal": equal, "layouts": layouts, "calls": calls, "auto": {k: v for k, v in data.items() if "auto" in k},
            "params": {k: v.detach().clone() for k, v in ours.named_parameters()},
            "peak_extra": max(peaks) - total if peaks else None}


def train_with_injected_timings(rank, world_size):
    """Each rank reports different timings (as a loaded or slower rank would); returns what it chose."""
    model = build("cnn_bn")
    ddp = DistributedDataParallel(model, bucket_cap_mb="auto")
    own, measured = ddp._auto.local_figures, {}

    def skewed():
        figures = own()
        if rank == 0:  # per-call latency dominates
            figures["seconds"] = [5e-3 for _ in figures["sizes"]]
        elif rank == 1:  # bytes are expensive and gradients arrive far apart: small buckets hide them
            figures["seconds"] = [size * 1e-5 for size in figures["sizes"]]
            position = {index: k for k, index in enumerate(ddp.reducer.order)}
            figures["ready"] = [(position[i] + 1) * 1e-2 for i in range(len(figures["ready"]))]
            figures["backward"] = len(figures["ready"]) * 1e-2
        else:
            figures["seconds"] = [s * 3 for s in figures["seconds"]]
        measured.update(figures)
        return figures

    ddp._auto.local_figures = skewed
    # and each rank measured the shortlist differently: alone, each would pick another layout
    table = [[1.0, 2.0, 3.0], [3.0, 2.0, 1.0], [2.0, 1.0, 3.0]][rank]
    ddp._auto.round_figures = lambda: {slot: table[slot] for slot in ddp._auto._timed}
    opt = make_optimizer("sgd", ddp.parameters())
    for step in range(STEPS):
        opt.zero_grad()
        loss_of(ddp, "cnn_bn", make_batch("cnn_bn", rank, step)).backward()
        opt.step()
    data = ddp.get_ddp_logging_data()
    r = ddp.reducer
    specs = ddp._auto._specs()
    # What this rank alone would have chosen from its own figures (to show the ranks did see different things)
    alone = choose_cap(specs, r.order, measured["ready"], measured["backward"],
                       AllReduceCost.fit(measured["sizes"], measured["seconds"]), measured["rest"])
    return {"auto": {k: v for k, v in data.items() if "auto" in k}, "bucket_sizes": data["bucket_sizes"],
            "alone": (alone.cap_mb, alone.first_cap_mb), "params": [p.detach().clone() for p in model.parameters()]}


@pytest.fixture(scope="module")
def two_ranks():
    with RankPool(2, timeout=120) as pool:
        yield {view: pool.run(train_auto_and_torch, (view,), timeout=120) for view in (False, True)}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("bucket_view", [False, True], ids=["copy", "bucket_view"])
def test_gradients_equal_torch_ddp_with_a_fixed_cap_before_and_after_the_switch(two_ranks, bucket_view):
    for rank, result in enumerate(two_ranks[bucket_view]):
        assert all(result["equal"]), f"rank {rank}: gradients differ from PyTorch's DDP at steps {result['equal']}"


@pytest.mark.timeout(240)
def test_parameters_equal_single_process_training(two_ranks):
    reference = train_locally("bert", "sgd", 2, STEPS)
    for key, expected in reference.named_parameters():
        for result in two_ranks[False]:
            torch.testing.assert_close(result["params"][key], expected.detach(), rtol=1e-4, atol=1e-5)


def _visit_starts(leader: int = 1) -> tuple[list[int], list[int]]:
    """Synchronised iterations done when each visit of the measured search begins, and the slot of each
    visit: round 1 over the shortlist of three, then the leader and the measured layout, alternating."""
    order = list(range(auto_bucket.SHORTLIST))
    for k in range(auto_bucket.SEARCH_ROUNDS - 1):
        order += [leader, 0] if k % 2 == 0 else [0, leader]
    return [auto_bucket.DECIDE_AT - 1 + v * auto_bucket.VISIT for v in range(len(order))], order


@pytest.mark.timeout(240)
def test_the_search_tries_the_shortlist_and_the_final_switch_comes_within_the_budget(two_ranks):
    starts, order = _visit_starts()
    # a re-bucketing where a visit moves to another layout; the last visit was on the winner, so no more
    moves = [start for k, start in enumerate(starts) if k > 0 and order[k] != order[k - 1]]
    final = auto_bucket.DECIDE_AT - 1 + auto_bucket.SEARCH_ITERATIONS
    assert order[-1] == 1 and len(starts) * auto_bucket.VISIT == auto_bucket.SEARCH_ITERATIONS
    for result in two_ranks[False]:
        assert result["calls"] == moves, (result["calls"], moves, final)
        assert result["auto"]["auto_bucket_decided_after_iterations"] == final <= auto_bucket.BUDGET
        layouts = result["layouts"]
        measuring = layouts[auto_bucket.WARMUP - 1:auto_bucket.DECIDE_AT - 1]  # after the usual rebuild
        assert len(set(measuring)) == 1 and len(set(layouts[final:])) == 1
        # each visit ran on one layout, and the search tried three different ones
        visits = [layouts[start:start + auto_bucket.VISIT] for start in starts]
        assert all(len(set(v)) == 1 for v in visits) and len({v[0] for v in visits}) == auto_bucket.SHORTLIST
        assert [visits[k][0] == visits[1][0] for k in range(len(visits))] == [slot == 1 for slot in order]
        # expensive bytes, gradients far apart: the model's best (measured fastest here) has more, smaller
        # buckets than the 4 KB ones it measured on
        assert layouts[final] == visits[1][0]
        assert len(layouts[-1].split(",")) > len(measuring[0].split(",")) > 1, layouts


@pytest.mark.timeout(240)
def test_logging_data_name_the_cap_and_every_candidate(two_ranks):
    auto = two_ranks[False][0]["auto"]
    assert auto["auto_bucket_state"] == "chosen" and auto["bucket_cap_auto"] == 1
    cap, first = auto["auto_bucket_cap_mb"], auto["auto_first_bucket_cap_mb"]
    entries = auto["auto_bucket_predictions"].split("; ")
    assert len(entries) >= 3 and all(" ms (" in e for e in entries)
    assert any(e.startswith(f"{cap:g}/{first:g} MB:") for e in entries)
    # the measured search: three layouts, the measured one first, each timed VISIT - 1 times per round
    # it was visited in (the measured layout and the leader in all three, the third in round 1)
    trials = auto["auto_bucket_measured"].split("; ")
    timed = [auto_bucket.SEARCH_ROUNDS * (auto_bucket.VISIT - 1)] * 2 + [auto_bucket.VISIT - 1]
    assert [t.split("(")[1] for t in trials] == [f"{n} iterations)" for n in timed], trials
    assert trials[1].startswith(f"{cap:g}/{first:g} MB: 500.000 ms")
    assert auto["auto_bucket_reason"].startswith(f"chose {cap:g}/{first:g} MB: measured faster:"), auto
    assert "0.500, 0.500, 0.500; geometric mean 0.500 [0.500, 0.500]" in auto["auto_bucket_reason"]
    assert auto["auto_bucket_search_ratio"] == pytest.approx(0.5) and auto["auto_bucket_search_ci_high"] < 1
    assert auto["auto_bucket_model"] in ("overlapped", "serial")
    assert two_ranks[False][0]["auto"] == two_ranks[False][1]["auto"] | {
        "auto_bucket_tuning_seconds": auto["auto_bucket_tuning_seconds"]}


@pytest.mark.timeout(240)
def test_the_switch_costs_at_most_one_extra_copy_of_the_largest_bucket(two_ranks):
    for view in (False, True):
        for result in two_ranks[view]:
            assert result["peak_extra"] is not None
            # beyond one copy of the gradients: at most the largest bucket (the new one being filled) of
            # any layout from the model's decision on (the search switches several times)
            largest = max(int(size) for layout in result["layouts"][auto_bucket.DECIDE_AT - 2:]
                          for size in layout.split(", "))
            assert result["peak_extra"] <= largest, (view, result["peak_extra"], largest)
            if not view:  # copied gradients: the old buckets go before the new ones come
                assert result["peak_extra"] == 0


@pytest.mark.timeout(240)
def test_ranks_agree_even_when_their_timings_differ():
    with RankPool(3, timeout=120) as pool:
        results = pool.run(train_with_injected_timings, (), timeout=120)
    assert results[0]["alone"] != results[1]["alone"], "the injected timings did not make the ranks see different things"
    first = results[0]
    # the slowest rank's medians [3, 2, 3]: the shortlist's second is the fastest, on every rank
    trials = first["auto"]["auto_bucket_measured"].split("; ")
    assert [t.split(": ")[1].split(" ms")[0] for t in trials] == ["3000.000", "2000.000", "3000.000"], trials
    auto = first["auto"]
    assert trials[1].startswith(f"{auto['auto_bucket_cap_mb']:g}/{auto['auto_first_bucket_cap_mb']:g} MB:"), trials
    for rank, result in enumerate(results[1:], start=1):
        auto = dict(result["auto"], auto_bucket_tuning_seconds=None)
        assert auto == dict(first["auto"], auto_bucket_tuning_seconds=None), f"rank {rank} chose differently"
        assert result["bucket_sizes"] == first["bucket_sizes"]
        assert all(torch.equal(p, q) for p, q in zip(result["params"], first["params"])), f"rank {rank}'s replica differs"
