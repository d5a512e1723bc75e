"""bucket_cap_mb="auto": the schedule model ranks and shortlists (unit tests of the pure functions), the
measured search decides among the shortlist, the same on every rank even when their timings differ, within
the budget, told by the logging data, and it leaves gradients exactly those of a fixed cap (PyTorch's DDP)
and of single-process training."""
import math
import random

import pytest
import torch

from ddp_core import DistributedDataParallel, auto_bucket
from ddp_core.auto_bucket import AllReduceCost, choose_cap, choose_model, predict
from ddp_core.bucketing import MB, TensorSpec


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


def test_the_search_names_a_leader_in_round_one_then_confirms_it_in_alternating_rounds():
    verdict = auto_bucket.search_verdict([{0: 1.0, 1: 0.97, 2: 0.9}])
    assert verdict.winner is None and verdict.leader == 2 and verdict.next_round == (2, 0)
    verdict = auto_bucket.search_verdict([{0: 1.0, 1: 0.97, 2: 0.9}, {2: 0.91, 0: 1.0}])
    assert verdict.winner is None and verdict.next_round == (0, 2)
    verdict = auto_bucket.search_verdict([{0: 1.0, 1: 0.97, 2: 0.9}, {2: 0.91, 0: 1.0}, {0: 1.0, 2: 0.89}])
    assert verdict.winner == 2 and verdict.ratio == pytest.approx((0.9 * 0.91 * 0.89) ** (1 / 3))
    assert verdict.interval[0] < verdict.ratio < verdict.interval[1] < 1 and verdict.why.startswith("measured faster")
    # the suite's own interval over rounds (ddp_core cannot import it) gives the same figures
    from experiments.core.stats import geometric_mean_ratio

    suite = geometric_mean_ratio(list(verdict.ratios), confidence=0.95)
    assert (verdict.ratio, *verdict.interval) == pytest.approx((suite["ratio"], *suite["ci"]), rel=1e-9)


def test_the_search_keeps_the_measured_layout_unless_the_rounds_show_the_leader_faster():
    gain = auto_bucket.MIN_MEASURED_GAIN
    # round 1: no layout min_gain faster; equal times name the earlier layout the leader
    kept = auto_bucket.search_verdict([{0: 1.0, 1: 1.0 - gain / 2, 2: 1.1}])
    assert kept.winner == 0 and kept.leader == 1 and "round 1" in kept.why
    assert auto_bucket.search_verdict([{0: 1.0, 1: 0.9, 2: 0.9}]).leader == 1
    # a later round with the leader no faster ends the search at once
    kept = auto_bucket.search_verdict([{0: 1.0, 1: 0.9, 2: 1.1}, {1: 1.01, 0: 1.0}])
    assert kept.winner == 0 and "no faster in a later round" in kept.why
    # three rounds all faster, but too spread for the interval to exclude 1
    spread = auto_bucket.search_verdict([{0: 1.0, 1: 0.7, 2: 1.1}, {1: 0.99, 0: 1.0}, {0: 1.0, 1: 0.95}])
    assert spread.winner == 0 and spread.interval[1] >= 1 and "interval reaches 1" in spread.why
    # consistent, but less than min_gain faster
    small = auto_bucket.search_verdict([{0: 1.0, 1: 0.979, 2: 1.1}, {1: 0.985, 0: 1.0}, {0: 1.0, 1: 0.982}])
    assert small.winner == 0 and small.interval[1] < 1 and f"less than {gain:.0%} faster" in small.why
    assert auto_bucket.search_verdict([{0: 1.0}]).winner == 0


def _simulated_switches(spread: float, truth: tuple[float, float, float], searches: int, seed: int) -> float:
    """Share of searches that leave the measured layout, each round's figure per layout the truth times
    log-normal noise of `spread` (independent per layout and round)."""
    rng = random.Random(seed)
    switches = 0
    for _ in range(searches):
        rounds = []
        verdict = auto_bucket.Verdict(None, (0, 1, 2))
        while verdict.winner is None:
            rounds.append({k: truth[k] * math.exp(rng.gauss(0.0, spread)) for k in verdict.next_round})
            verdict = auto_bucket.search_verdict(rounds)
        switches += verdict.winner != 0
    return switches / searches


@pytest.mark.parametrize("spread", [0.01, 0.03, 0.08, 0.15])
def test_a_switch_on_noise_is_rare_at_any_spread(spread):
    # all three layouts equally fast: any switch is a false one (5000 searches: the share is known to +-0.5%)
    assert _simulated_switches(spread, (1.0, 1.0, 1.0), 5000, seed=1) <= 0.045


def test_a_real_gain_is_found_where_the_machine_is_quiet_and_a_worse_layout_never_wins():
    assert _simulated_switches(0.01, (1.0, 0.92, 1.0), 2000, seed=2) >= 0.95  # 8% at 1% spread (a GPU's)
    assert _simulated_switches(0.02, (1.0, 0.90, 1.05), 2000, seed=3) >= 0.8
    assert _simulated_switches(0.05, (1.0, 1.05, 1.10), 2000, seed=4) <= 0.01


def test_the_t_quantile_is_students():
    from scipy.stats import t

    assert auto_bucket.T_975 == pytest.approx(t.ppf(0.975, auto_bucket.SEARCH_ROUNDS - 1), rel=1e-12)
    with pytest.raises(ValueError, match="needed must be 3"):
        auto_bucket.search_verdict([{0: 1.0, 1: 0.5}], needed=4)


def test_the_reason_names_the_measured_figures_that_decided():
    candidates = (auto_bucket.Candidate(25, 1, 3, 0.0, 0.4), auto_bucket.Candidate(1, 1, 40, 0.0, 0.3))
    rounds = [{0: 0.4, 1: 0.3}, {1: 0.31, 0: 0.4}, {0: 0.41, 1: 0.3}]
    verdict = auto_bucket.search_verdict(rounds, ["25/1 MB", "1/1 MB"])
    trials = (auto_bucket.Trial(25, 1, 0.4, 6, (0.4, 0.4, 0.41)), auto_bucket.Trial(1, 1, 0.3, 6, (0.3, 0.31, 0.3)))
    chose = auto_bucket.Decision(1, 1, "overlapped", candidates, trials=trials, verdict=verdict).reason()
    assert chose.startswith("chose 1/1 MB: measured faster: 1/1 MB / 25/1 MB per round: 0.750, 0.775, 0.732; "
                            "geometric mean 0.752 ["), chose
    assert chose.endswith("] (t 95% over 3 rounds)")
    kept = auto_bucket.search_verdict([{0: 0.4, 1: 0.395}], ["25/1 MB", "1/1 MB"])
    assert auto_bucket.Decision(25, 1, "overlapped", candidates, kept=True, trials=trials, verdict=kept).reason() == (
        "kept 25/1 MB: no layout measured 2% faster in round 1 (the fastest, 1/1 MB / 25/1 MB per round: 0.988)")


def test_the_search_fits_the_budget():
    assert auto_bucket.DECIDE_AT - 1 + auto_bucket.SEARCH_ITERATIONS <= auto_bucket.BUDGET <= 30
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
