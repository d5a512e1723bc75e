"""Other processes on the machine while configs were measured: the cores they kept busy per config (in
the record's `timing.other_cores_busy`), a short mark on that config's line, and one warning per run.

A config measured beside other work has latencies that include waiting for a core. On a shared
machine that happens to most configs of a run, and a 250-character warning after each one buried the
results it was warning about; the run now says it once, at its end, with the worst figure.
"""
from __future__ import annotations

import os

from experiments.core.machine import QUIET_CORES


def other_cores_busy(per_rank: list[dict]) -> float | None:
    """The cores that processes other than the ranks kept busy on average during the measured iterations,
    on rank 0's host: the machine's busy time less what that host's ranks used. None where unknown."""
    loads = [r.get("load") for r in per_rank]
    if None in loads or loads[0]["machine_busy_s"] is None or loads[0]["measuring_s"] <= 0:
        return None
    ours = sum(load["own_cpu_s"] for load in loads if load["host"] == loads[0]["host"])
    return max(0.0, loads[0]["machine_busy_s"] - ours) / loads[0]["measuring_s"]


def busy_cores(record: dict) -> float | None:
    """The cores others kept busy while `record` was measured, where above QUIET_CORES; else None."""
    other = (record.get("timing") or {}).get("other_cores_busy")
    return other if other is not None and other > QUIET_CORES else None


def busy_mark(record: dict) -> str:
    """What a config's progress line adds where others kept cores busy during it: "  (busy: 1.0 other
    cores)"; empty otherwise."""
    other = busy_cores(record)
    return "" if other is None else f"  (busy: {other:.1f} other cores)"


class BusyTally:
    """The configs of one run that others kept cores busy during, for the run's one warning."""

    def __init__(self) -> None:
        self.busy: list[tuple[float, str]] = []  # (cores, the config's progress label)
        self.measured = 0
        self.cores: int | None = None

    def add(self, record: dict, label: str) -> None:
        """Count a finished config; `label` names it as its progress line does ("[3/8]")."""
        if record.get("status") != "ok":
            return
        self.measured += 1
        self.cores = self.cores or (record.get("env") or {}).get("cpu_count")
        if (other := busy_cores(record)) is not None:
            self.busy.append((other, label))

    def warning(self) -> str | None:
        """One warning for the run where any config was measured beside busy cores, naming how many and
        the worst; None on a quiet run."""
        if not self.busy:
            return None
        worst, label = max(self.busy)
        cores = self.cores or os.cpu_count()
        return (f"ddpbench: warning: other processes kept cores busy while {len(self.busy)} of {self.measured} "
                f"configs were measured (marked 'busy'; worst {worst:.1f} of {cores} cores, {label}): their "
                "latencies may include waiting for a core. Measure them again on a quiet machine (--resume "
                "skips configs already recorded: remove their records or use another --out)")
