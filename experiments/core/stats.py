"""Statistics from raw samples: summaries of latency, and ratios of medians with confidence intervals.

Two ways to compare latencies of BASE and NEW:
- `ratio_of_medians`: pooled samples, bootstrap interval; for unrelated record files.
- `paired_ratio`: A/B rounds run back to back (one process start of each per round). Each round's
  ratio median(NEW)/median(BASE) cancels what drifts between rounds (other load, clock, memory
  placement), so the rounds' ratios vary much less than the pooled samples; their geometric mean
  gets a Student t interval over rounds (a paired t-test on log medians).
"""
from __future__ import annotations

import statistics

import numpy as np
from scipy.stats import bootstrap, ttest_1samp


def summarize(latency_s: list[float], samples_per_iteration: int) -> dict:
    """Mean, percentiles, min and max of per-iteration latency, and throughput at the median."""
    x = np.asarray(latency_s, dtype=float)
    p50, p90, p95 = np.percentile(x, [50, 90, 95])
    return {
        "mean": float(x.mean()), "p50": float(p50), "p90": float(p90), "p95": float(p95),
        "min": float(x.min()), "max": float(x.max()), "n": int(x.size),
        "throughput": samples_per_iteration / float(p50),  # samples/s over all ranks
    }


def ratio_of_medians(numerator: list[float], denominator: list[float], confidence: float = 0.95) -> dict:
    """median(numerator) / median(denominator), with a percentile-bootstrap confidence interval."""
    ci = bootstrap(
        (np.asarray(numerator), np.asarray(denominator)),
        lambda a, b: np.median(a) / np.median(b),
        vectorized=False, paired=False, n_resamples=2000, confidence_level=confidence, method="percentile",
        random_state=0,
    ).confidence_interval
    return {"ratio": statistics.median(numerator) / statistics.median(denominator),
            "ci": [float(ci.low), float(ci.high)], "confidence": confidence}


def slowest_rank_per_cycle(per_rank: list[list[float]], sync_every: int) -> list[int]:
    """For each iteration, the rank whose cycle of `sync_every` iterations took longest: that rank sets the
    job's latency. Ranks meet only at a cycle's synchronised end; with n = 1 this is the slowest rank of
    each iteration. For n > 1 the slowest rank of each iteration would count a lag twice: in the lagging
    rank's skipped iterations, and again as the other ranks' wait at the sync."""
    if len({len(seconds) for seconds in per_rank}) != 1:
        raise ValueError(f"every rank needs the same number of iterations, got {[len(s) for s in per_rank]}")
    ranks: list[int] = []
    for start in range(0, len(per_rank[0]), sync_every):
        cycle = slice(start, start + sync_every)
        slowest = max(range(len(per_rank)), key=lambda rank: sum(per_rank[rank][cycle]))
        ranks += [slowest] * len(per_rank[slowest][cycle])
    return ranks


def phase_medians(phases_s: dict[str, list[list[float | None]]], sync_every: int) -> dict[str, float | None]:
    """Median seconds of each phase (`phases_s`: phase -> rank -> iteration), each iteration's taken from
    the rank that set its latency, so the phases add up to a latency that was measured. (The maximum over
    ranks per phase would count one rank's lag in compute again as another rank's wait for
    communication.) With one synchronisation per iteration the ranks finish together and which rank is
    slowest turns on small skews, so this is a mix of the ranks' breakdowns, iteration by iteration. A
    phase that is not measured (None) has no median."""
    per_rank = [[sum(phases_s[p][rank][i] or 0.0 for p in phases_s) for i in range(len(iterations))]
                for rank, iterations in enumerate(next(iter(phases_s.values())))]
    chosen = slowest_rank_per_cycle(per_rank, sync_every)
    medians = {}
    for phase, ranks in phases_s.items():
        values = [ranks[rank][i] for i, rank in enumerate(chosen) if ranks[rank][i] is not None]
        medians[phase] = statistics.median(values) if values else None
    return medians


def cycle_means(samples: list[float], n: int) -> list[float]:
    """Average latency of each whole cycle of n iterations (n-1 skipped synchronisations, then one):
    what an iteration costs on average under reduce-every-n. The median of single iterations would only
    show the cheap, unsynchronised ones."""
    whole = len(samples) // n * n
    return [float(np.mean(samples[i:i + n])) for i in range(0, whole, n)]


def paired_ratio(numerator_rounds: list[list[float]], denominator_rounds: list[list[float]],
                 confidence: float = 0.99) -> dict:
    """Rounds paired by position: the geometric mean over rounds of median(numerator)/median(denominator),
    with a t confidence interval on the log ratios (needs at least two rounds)."""
    if len(numerator_rounds) != len(denominator_rounds) or len(numerator_rounds) < 2:
        raise ValueError("paired_ratio needs the same number (>= 2) of numerator and denominator rounds")
    return geometric_mean_ratio([np.median(n) / np.median(d) for n, d in zip(numerator_rounds, denominator_rounds)],
                                confidence)


def geometric_mean_ratio(ratios: list[float], confidence: float = 0.99) -> dict:
    """The geometric mean of independent ratios, with a t confidence interval on their logs (>= 2)."""
    if len(ratios) < 2:
        raise ValueError(f"a t interval needs at least 2 ratios, got {len(ratios)}")
    logs = np.log(ratios)
    ci = ttest_1samp(logs, 0.0).confidence_interval(confidence)
    return {"ratio": float(np.exp(logs.mean())), "ci": [float(np.exp(ci.low)), float(np.exp(ci.high))],
            "confidence": confidence, "round_ratios": np.exp(logs).tolist()}
