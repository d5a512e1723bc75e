"""How far a prediction may lie from what `run` would measure: intervals from the model's own
validation errors, the line that says a change is smaller than them, and warnings where a prediction
extrapolates beyond the all-reduce records it was fitted to.

The errors are the model's against measured runs on the reference machine, as the main job's report
keeps them (results/reference/x86_64-2cpu/tables/; docs/performance-model.md): over loopback
(model_validation.csv, `run` at 1-2 ranks) and behind emulated links (link_emulation.csv). Each error
is predicted / measured - 1, so a run lies in [predicted / (1 + q_high), predicted / (1 + q_low)] as
often as those quantiles of the errors say. A cluster preset (GPUs) was never validated: no interval.
"""
from __future__ import annotations

import csv
import functools
import statistics
from dataclasses import dataclass
from pathlib import Path

import numpy as np

TABLES = Path(__file__).resolve().parents[2] / "results" / "reference" / "x86_64-2cpu" / "tables"
SETS = {"loopback": "model_validation.csv", "link": "link_emulation.csv"}
COVERAGE = 0.9  # the share of validation runs an interval covers


@dataclass(frozen=True)
class ModelError:
    """The model's errors against measured runs of one kind (loopback or emulated links)."""

    kind: str
    errors: tuple[float, ...]  # predicted / measured - 1, one per validation run
    source: str

    @property
    def median_abs(self) -> float:
        """The median |error|: what a difference between two predictions must exceed to be worth acting on."""
        return statistics.median(abs(e) for e in self.errors)

    def interval(self, predicted: float, coverage: float = COVERAGE) -> tuple[float, float]:
        """Where a measured run of a prediction `predicted` lies in `coverage` of the validation runs."""
        low, high = np.quantile(self.errors, [(1 - coverage) / 2, (1 + coverage) / 2])
        return predicted / (1 + high), predicted / (1 + low)

    def describe(self) -> str:
        """One line: where the intervals come from."""
        return (f"intervals: {COVERAGE:.0%} of the model's errors against {len(self.errors)} measured runs "
                f"({self.kind}; median |error| {self.median_abs:.1%}; {self.source})")


@functools.lru_cache(maxsize=None)
def _load(kind: str) -> ModelError | None:
    path = TABLES / SETS[kind]
    try:
        with path.open() as handle:
            errors = tuple(float(row["error"]) for row in csv.DictReader(handle) if row.get("error"))
    except (OSError, KeyError, ValueError):
        return None
    return ModelError(kind, errors, str(path.relative_to(TABLES.parents[3]))) if len(errors) >= 5 else None


def model_error(comm) -> ModelError | None:
    """The validation errors that apply to predictions on `comm`: behind emulated links, over loopback
    (a fit to this machine's all-reduce), or None for a cluster preset (never validated)."""
    if comm.measured is None:  # a preset: nothing of it was measured
        return None
    return _load("link" if comm.inter is not None else "loopback")


def format_interval(error: ModelError | None, predicted_s: float) -> str:
    """`[low, high] ms` of a prediction, or `-` without validation errors."""
    if error is None:
        return "-"
    low, high = error.interval(predicted_s)
    return f"[{low * 1e3:.1f}, {high * 1e3:.1f}]"


def within_error(error: ModelError | None, change: float) -> bool:
    """Whether a predicted relative change is smaller than the model's median |error| (not worth acting on)."""
    return error is not None and abs(change) < error.median_abs


def extrapolation(comm, world_sizes: list[int], largest_bytes: float) -> list[str]:
    """Warnings where a prediction lies outside what the all-reduce fit measured: world sizes above its
    records', messages larger than its largest."""
    measured = comm.measured
    if not measured:
        return []
    lines = []
    beyond = sorted({n for n in world_sizes if n > max(measured["world_sizes"])})
    if beyond:
        lines.append(f"world size{'s' * (len(beyond) > 1)} {', '.join(map(str, beyond))} "
                     f"{'are' if len(beyond) > 1 else 'is'} extrapolated: the all-reduce was measured at "
                     f"{', '.join(map(str, measured['world_sizes']))} rank(s) only; the ring formula carries it "
                     "further, unchecked on this machine")
    if largest_bytes > measured["max_bytes"]:
        lines.append(f"a message of {largest_bytes / 2**20:.0f} MiB is extrapolated: the largest all-reduce measured "
                     f"was {measured['max_bytes'] / 2**20:.0f} MiB")
    return lines
