"""Statistics from raw samples: summaries of latency, and ratios of medians with confidence intervals."""
from __future__ import annotations

import statistics

import numpy as np
from scipy.stats import bootstrap


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
