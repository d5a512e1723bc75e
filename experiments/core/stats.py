"""Statistics from raw samples: summaries of latency, and ratios of medians with confidence intervals.

Three ways to compare latencies of BASE and NEW:
- `ratio_of_medians`: pooled samples, bootstrap interval: the noise between iterations of one launch only
  (the sweep report's cells, measured one launch each, side by side).
- `launch_ratio`: separate process launches (records) on each side, unpaired: the unit of replication
  is the launch, whose median moves by more between launches (placement, page faults, other load) than
  the iterations inside one launch show; a t interval over launch medians, with this machine's stored
  launch-to-launch drift where a side has too few launches to show it.
- `paired_ratio`: A/B rounds run back to back (one process start of each per round). Each round's
  ratio median(NEW)/median(BASE) cancels what drifts between rounds (other load, clock, memory
  placement), so the rounds' ratios vary much less than the pooled samples; their geometric mean
  gets a Student t interval over rounds (a paired t-test on log medians).
"""
from __future__ import annotations

import math
import statistics

import numpy as np

# scipy.stats is imported in the functions that use it: it takes ~0.3 s, and the command line imports
# this module (through compare) only to parse its options.


# The fewest samples a tail quantile is estimated from: at least two samples beyond it (2 / (1 - q)).
# Below that a "p95" is the largest sample or an interpolation towards it, not a 95th percentile.
MIN_SAMPLES = {"p90": 20, "p95": 40}


def spread(samples) -> tuple[float, float, float]:
    """Median and interquartile range (25th, 75th percentile) of raw samples."""
    q25, q50, q75 = np.percentile(np.asarray(samples, dtype=float), [25, 50, 75])
    return float(q50), float(q25), float(q75)


def median_interval(samples: list[float], confidence: float = 0.95) -> list[float] | None:
    """A distribution-free confidence interval of the median from order statistics (the binomial
    count of samples below it); None with fewer than 6 samples, where no pair of them reaches 95%."""
    from scipy.stats import binom

    x = np.sort(np.asarray(samples, dtype=float))
    n = x.size
    if n < 6:
        return None
    low = int(binom.ppf((1 - confidence) / 2, n, 0.5))  # samples below the interval's low end
    low = max(low - 1, 0) if binom.cdf(low, n, 0.5) > (1 - confidence) / 2 else low
    return [float(x[low]), float(x[n - 1 - low])]


def summarize(latency_s: list[float], samples_per_iteration: int) -> dict:
    """Mean, median with its 95% interval over iterations, percentiles, min and max of per-iteration latency,
    and throughput at the median. p90 and p95 are None below MIN_SAMPLES samples."""
    x = np.asarray(latency_s, dtype=float)
    p50, p90, p95 = np.percentile(x, [50, 90, 95])
    return {
        "mean": float(x.mean()), "p50": float(p50), "p50_ci": median_interval(latency_s),
        "p90": float(p90) if x.size >= MIN_SAMPLES["p90"] else None,
        "p95": float(p95) if x.size >= MIN_SAMPLES["p95"] else None,
        "min": float(x.min()), "max": float(x.max()), "n": int(x.size),
        "throughput": samples_per_iteration / float(p50),  # samples/s over all ranks
    }


def ratio_of_medians(numerator: list[float], denominator: list[float], confidence: float = 0.95,
                     null: float = 1.0) -> dict:
    """median(numerator) / median(denominator), with a percentile-bootstrap confidence interval, and the
    bootstrap's two-sided p-value of the ratio being `null` (twice the share of resampled ratios on the
    far side of it; at least 1/resamples)."""
    from scipy.stats import bootstrap

    result = bootstrap(
        (np.asarray(numerator), np.asarray(denominator)),
        lambda a, b: np.median(a) / np.median(b),
        vectorized=False, paired=False, n_resamples=2000, confidence_level=confidence, method="percentile",
        random_state=0,
    )
    resampled = np.asarray(result.bootstrap_distribution)
    tail = min(float((resampled <= null).mean()), float((resampled >= null).mean()))
    ci = result.confidence_interval
    return {"ratio": statistics.median(numerator) / statistics.median(denominator),
            "ci": [float(ci.low), float(ci.high)], "confidence": confidence,
            "p": min(1.0, max(2 * tail, 1 / resampled.size))}


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
    from scipy.stats import ttest_1samp

    if len(ratios) < 2:
        raise ValueError(f"a t interval needs at least 2 ratios, got {len(ratios)}")
    logs = np.log(ratios)
    test = ttest_1samp(logs, 0.0)
    ci = test.confidence_interval(confidence)
    return {"ratio": float(np.exp(logs.mean())), "ci": [float(np.exp(ci.low)), float(np.exp(ci.high))],
            "confidence": confidence, "p": float(test.pvalue), "round_ratios": np.exp(logs).tolist()}


def launch_ratio(numerator_medians: list[float], denominator_medians: list[float], confidence: float = 0.99,
                 prior_sd: float | None = None, prior_df: int = 0, null: float = 1.0) -> dict | None:
    """Two groups of separate process launches (one median latency each): the ratio of their geometric
    means, with a t interval on the difference of mean log medians.

    The launch-to-launch standard deviation of log medians is pooled from the launches' own spread about
    each group's mean (n - 2 degrees of freedom) and, where given, a stored measurement of this machine's
    drift (`prior_sd` with `prior_df` degrees of freedom): so one launch per side still gets an interval,
    as wide as the machine's measured drift makes it. None when no degree of freedom is left (one launch
    per side and no stored drift): nothing can say how far two launches stray. `p`: the two-sided
    p-value of the ratio being `null`.
    """
    from scipy.stats import t as t_distribution

    logs = [np.log(np.asarray(side, dtype=float)) for side in (numerator_medians, denominator_medians)]
    own_df = sum(x.size - 1 for x in logs)
    squares = sum(float(((x - x.mean()) ** 2).sum()) for x in logs)
    df = own_df + (prior_df if prior_sd is not None else 0)
    if df < 1:
        return None
    sd = math.sqrt((squares + (prior_df * prior_sd ** 2 if prior_sd is not None else 0.0)) / df)
    difference = float(logs[0].mean() - logs[1].mean())
    error = sd * math.sqrt(sum(1 / x.size for x in logs))
    half = float(t_distribution.ppf(0.5 + confidence / 2, df)) * error
    off = difference - math.log(null)
    p = float(2 * t_distribution.sf(abs(off) / error, df)) if error > 0 else float(off == 0)
    return {"ratio": math.exp(difference), "ci": [math.exp(difference - half), math.exp(difference + half)],
            "confidence": confidence, "p": p, "sd": sd, "df": df, "launches": [int(x.size) for x in logs]}


def holm(p_values: list[float]) -> list[float]:
    """Holm's step-down adjustment of p-values (family-wise error control over many tests at once):
    the i-th smallest times (m - i + 1), kept monotone, at most 1."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    adjusted, running = [1.0] * len(p_values), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p_values) - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


def benjamini_hochberg(p_values: list[float]) -> list[float]:
    """Benjamini-Hochberg adjusted p-values (false discovery rate control over many tests at once; scipy's)."""
    from scipy.stats import false_discovery_control

    return [float(p) for p in false_discovery_control(p_values)] if p_values else []
