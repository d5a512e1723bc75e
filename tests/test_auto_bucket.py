"""bucket_cap_mb="auto": the schedule model ranks and shortlists (unit tests of the pure functions), the
measured search decides among the shortlist, the same on every rank even when their timings differ, within
the budget, told by the logging data, and it leaves gradients exactly those of a fixed cap (PyTorch's DDP)
and of single-process training."""
import math
import weakref

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel as TorchDDP

from ddp_core import DistributedDataParallel, auto_bucket, bucket_layout
from ddp_core.auto_bucket import AllReduceCost, choose_cap, choose_model, predict
from ddp_core.bucketing import MB, TensorSpec
from experiments.measure.launch import RankPool
from tests.tiny_models import build, loss_of, make_batch, make_optimizer, train_locally

STEPS = auto_bucket.DECIDE_AT + auto_bucket.SEARCH_ITERATIONS + 3  # a few iterations on the chosen buckets


# --- the pure decision ---

def _layers(count=16, mb=1.0, step=1e-3):
    """`count` equal gradients of `mb` MB, ready one every `step` seconds, in order."""
    specs = [TensorSpec(int(mb * MB), "float32") for _ in range(count)]
    return specs, list(range(count)), [(i + 1) * step for i in range(count)], count * step


def test_expensive_bytes_and_overlap_choose_a_small_cap():
    specs, order, ready, backward = _layers()
    # 1 ms per MB, almost no per-call latency: a bucket per layer hides all but the last behind backward
    cost = AllReduceCost(latency=1e-5, per_byte=1e-3 / MB)
    decision = choose_cap(specs, order, ready, backward, cost)
    assert decision.cap_mb <= 1.0, decision.describe()
    one_bucket = next(c for c in decision.candidates if c.buckets == 1)
    best = min(decision.candidates, key=lambda c: c.predicted)
    assert best.exposed < 0.1 * one_bucket.exposed, decision.describe()


def test_per_call_latency_chooses_a_big_cap():
    specs, order, ready, backward = _layers()
    # 20 ms per call, bytes nearly free: every extra bucket costs a call that backward cannot hide
    cost = AllReduceCost(latency=20e-3, per_byte=1e-6 / MB)
    decision = choose_cap(specs, order, ready, backward, cost)
    chosen = next(c for c in decision.candidates if (c.cap_mb, c.first_cap_mb) == (decision.cap_mb, decision.first_cap_mb))
    assert chosen.buckets == 1, decision.describe()


def test_serial_model_adds_every_call_and_so_chooses_one_bucket():
    specs, order, ready, backward = _layers()
    cost = AllReduceCost(latency=1e-4, per_byte=1e-3 / MB)
    decision = choose_cap(specs, order, ready, backward, cost, model="serial")
    assert decision.model == "serial"
    assert decision.cap_mb * MB >= sum(s.nbytes for s in specs) / 2 ** 0 - 1  # the whole model in one bucket


def test_model_choice_follows_the_measured_exposed_communication():
    specs, order, ready, backward = _layers()
    cost = AllReduceCost(latency=1e-5, per_byte=1e-3 / MB)
    overlapped, _ = predict(specs, order, ready, backward, cost, 25, 1, "overlapped")
    serial, _ = predict(specs, order, ready, backward, cost, 25, 1, "serial")
    assert choose_model(specs, order, ready, backward, cost, overlapped, 25, 1) == "overlapped"
    assert choose_model(specs, order, ready, backward, cost, serial, 25, 1) == "serial"


def test_predictions_cover_every_candidate_and_name_the_caps():
    specs, order, ready, backward = _layers()
    decision = choose_cap(specs, order, ready, backward, AllReduceCost(1e-4, 1e-3 / MB), rest=5e-3)
    assert len(decision.candidates) >= 5
    assert all(c.predicted >= 5e-3 + backward for c in decision.candidates)  # rest + backward + exposed
    assert f"{decision.cap_mb:g}/{decision.first_cap_mb:g} MB" in decision.describe()


def test_a_gain_within_the_margin_keeps_the_measured_layout_and_a_larger_one_switches():
    specs, order, ready, backward = _layers()
    cost = AllReduceCost(latency=1e-5, per_byte=1e-3 / MB)  # small buckets pay (as in the test above)
    pairs = auto_bucket.candidate_caps(specs, order, measured=(25.0, 1.0))
    assert pairs[0] == (25.0, 1.0) and len(pairs) == len(set(pairs))
    free = choose_cap(specs, order, ready, backward, cost, candidates=pairs)
    gain = free.candidates[0].predicted - min(c.predicted for c in free.candidates)
    assert gain > 0 and (free.cap_mb, free.first_cap_mb) != (25.0, 1.0)
    kept = choose_cap(specs, order, ready, backward, cost, candidates=pairs, margin=gain * 1.01)
    assert kept.kept and (kept.cap_mb, kept.first_cap_mb) == (25.0, 1.0) and "within the margin" in kept.reason()
    switched = choose_cap(specs, order, ready, backward, cost, candidates=pairs, margin=gain * 0.99)
    assert not switched.kept and (switched.cap_mb, switched.first_cap_mb) == (free.cap_mb, free.first_cap_mb)
    assert "more than the margin" in switched.reason()


def test_equal_predictions_keep_the_measured_layout():
    specs, order, ready, backward = _layers()
    # serial model, no per-call latency: every layout predicts the same iteration (up to rounding)
    cost = AllReduceCost(latency=0.0, per_byte=1e-3 / MB)
    pairs = auto_bucket.candidate_caps(specs, order, measured=(25.0, 1.0))
    decision = choose_cap(specs, order, ready, backward, cost, model="serial", candidates=pairs, margin=1e-6)
    assert decision.kept and (decision.cap_mb, decision.first_cap_mb) == (25.0, 1.0)


def test_the_shortlist_holds_the_measured_layout_and_both_models_best():
    specs, order, ready, backward = _layers()
    cost = AllReduceCost(latency=1e-5, per_byte=1e-3 / MB)
    pairs = auto_bucket.candidate_caps(specs, order, measured=(25.0, 1.0))
    overlapped = choose_cap(specs, order, ready, backward, cost, candidates=pairs)
    serial = choose_cap(specs, order, ready, backward, cost, model="serial", candidates=pairs)
    picks = auto_bucket.shortlist(overlapped, serial)
    best = lambda d: min(range(1, len(pairs)), key=lambda k: (d.candidates[k].predicted, -d.candidates[k].cap_mb))
    assert picks == [0, best(overlapped), best(serial)] and len(set(picks)) == 3, picks
    # the two models agreeing: the ranking model's second best fills the place
    again = auto_bucket.shortlist(overlapped, overlapped)
    assert again[:2] == [0, best(overlapped)] and len(set(again)) == 3
    assert auto_bucket.shortlist(overlapped, serial, size=1) == [0]


def test_the_measured_search_keeps_the_measured_layout_unless_another_is_clearly_faster():
    gain = auto_bucket.MIN_MEASURED_GAIN
    assert auto_bucket.fastest_trial([1.0, 1.0 - gain / 2, 1.1]) == 0  # within the noise it allows
    assert auto_bucket.fastest_trial([1.0, 1.1, 1.0 - 2 * gain]) == 2
    assert auto_bucket.fastest_trial([1.0, 0.9, 0.9]) == 1  # equal times: the earlier layout
    assert auto_bucket.fastest_trial([1.0]) == 0


def test_the_reason_names_the_measured_figures_that_decided():
    candidates = (auto_bucket.Candidate(25, 1, 3, 0.0, 0.4), auto_bucket.Candidate(1, 1, 40, 0.0, 0.3))
    trial = auto_bucket.Trial

    def reason(seconds, kept):
        trials = (trial(25, 1, seconds[0], 4), trial(1, 1, seconds[1], 4))
        return auto_bucket.Decision(25 if kept else 1, 1, "overlapped", candidates, kept=kept, trials=trials).reason()

    assert reason([0.400, 0.300], False) == ("measured fastest of the 2 layouts tried: 1/1 MB measured 300.000 ms per "
                                             "iteration against 400.000 ms for 25/1 MB")
    assert reason([0.400, 0.395], True) == ("kept 25/1 MB: 1/1 MB measured 395.000 ms per iteration against "
                                            "400.000 ms for 25/1 MB, not 2% faster")
    assert reason([0.400, 0.420], True) == ("kept 25/1 MB: measured fastest of the 2 layouts tried (400.000 ms per "
                                            "iteration; the next, 1/1 MB, 420.000 ms)")


def test_the_search_fits_the_budget():
    assert auto_bucket.DECIDE_AT + auto_bucket.SEARCH_ITERATIONS <= auto_bucket.BUDGET <= 30
    assert auto_bucket.VISIT >= 2  # one iteration to settle on new buckets, at least one timed


def test_cost_fit_recovers_a_line_and_never_goes_negative():
    fitted = AllReduceCost.fit([1e3, 1e5, 1e6], [1e-4 + 2e-9 * x for x in (1e3, 1e5, 1e6)])
    assert fitted.latency == pytest.approx(1e-4) and fitted.per_byte == pytest.approx(2e-9)
    tilted = AllReduceCost.fit([1e3, 1e6], [2e-3, 1e-3])  # noise: bigger looked cheaper
    assert tilted.per_byte == 0 and tilted.latency > 0


@pytest.mark.parametrize("value", ["Auto", "25", -1, True, math.nan, math.inf, [25]])
def test_bad_caps_are_refused_naming_parameter_value_and_allowed(value):
    with pytest.raises(ValueError) as error:
        DistributedDataParallel(torch.nn.Linear(2, 2), bucket_cap_mb=value)
    message = str(error.value)
    assert "bucket_cap_mb" in message and repr(value) in message and '"auto"' in message and ">= 0" in message


# --- on ranks ---

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
    # and measured the model's best other layout (the shortlist's second) fastest
    ddp._auto.search_figures = lambda: [1.0, 0.5, 0.9][:len(ddp._auto._shortlist)]


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
    ddp._auto.search_figures = lambda: [[1.0, 2.0, 3.0], [3.0, 2.0, 1.0], [2.0, 1.0, 3.0]][rank]
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


def _visit_starts() -> list[int]:
    """Synchronised iterations done when each visit of the measured search begins (shortlist of three)."""
    slots = list(range(auto_bucket.SHORTLIST))
    order = [slot for k in range(auto_bucket.SEARCH_ROUNDS) for slot in (slots if k % 2 == 0 else slots[::-1])]
    return [auto_bucket.DECIDE_AT - 1 + v * auto_bucket.VISIT for v in range(len(order))], order


@pytest.mark.timeout(240)
def test_the_search_tries_the_shortlist_and_the_final_switch_comes_within_the_budget(two_ranks):
    starts, order = _visit_starts()
    # a re-bucketing where a visit moves to another layout, then one to the measured-fastest (not the last tried)
    moves = [start for k, start in enumerate(starts) if k > 0 and order[k] != order[k - 1]]
    final = auto_bucket.DECIDE_AT - 1 + auto_bucket.SEARCH_ITERATIONS
    for result in two_ranks[False]:
        assert result["calls"] == moves + [final], (result["calls"], moves, final)
        assert result["auto"]["auto_bucket_decided_after_iterations"] == final <= auto_bucket.BUDGET
        layouts = result["layouts"]
        measuring = layouts[auto_bucket.WARMUP - 1:auto_bucket.DECIDE_AT - 1]  # after the usual rebuild
        assert len(set(measuring)) == 1 and len(set(layouts[final:])) == 1
        # each visit ran on one layout, and the search tried three different ones
        visits = [layouts[start:start + auto_bucket.VISIT] for start in starts]
        assert all(len(set(v)) == 1 for v in visits) and len({v[0] for v in visits}) == auto_bucket.SHORTLIST
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
    trials = auto["auto_bucket_measured"].split("; ")
    timed = auto_bucket.SEARCH_ROUNDS * (auto_bucket.VISIT - 1)
    assert len(trials) == 3 and all(t.endswith(f"({timed} iterations)") for t in trials), trials
    assert trials[1].startswith(f"{cap:g}/{first:g} MB: 500.000 ms") and "measured fastest" in auto["auto_bucket_reason"]
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
