"""What every analysis script shares: where results live, loading them, medians with spread, saving.

Analysis reads only `results/` (through the package's record reader) and never imports the harness.
Set DDPBENCH_RESULTS to read and write another results folder (the tests do).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")  # files only, no screen
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from experiments.core.machine import machine_name  # noqa: E402
from experiments.core.records import RUN_PHASES, load_records, show_record_warnings_as_lines
from experiments.core.stats import cycle_means, spread  # noqa: E402,F401  (the analysis scripts use cycle_means from here)

ROOT = Path(__file__).resolve().parents[1]
show_record_warnings_as_lines()  # a skipped record line reads as one line naming its file
PHASES = list(RUN_PHASES)  # the figures stack them in this order
# Experiments whose records are training iterations (kind "run"); E1 and E6 have kinds of their own.
RUN_EXPERIMENTS = ["e2_overlap", "e3_bucket_size", "e4_scaling", "e5_skip_sync", "e7_round_robin"]


def results_dir() -> Path:
    """The results folder: $DDPBENCH_RESULTS, or results/ in the repository."""
    return Path(os.environ.get("DDPBENCH_RESULTS", ROOT / "results"))


def machine() -> str:
    """Whose results to analyse: $DDPBENCH_MACHINE, else this machine - never another machine's records
    taken for this one's (`./ddpbench report --reference` reads the project's committed results)."""
    return os.environ.get("DDPBENCH_MACHINE") or machine_name()


def machines_in(frame: pd.DataFrame) -> list[str]:
    """The machines whose records `frame` holds: their names and ids, or for records older than machine
    identities their host, CPU and core count."""
    found = set()
    for row in frame.to_dict("records"):
        ident = row.get("env_machine_id")
        if isinstance(ident, str) and ident:
            found.add(f"{row.get('env_machine')} (id {ident})")
        else:
            found.add(f"host {row.get('env_host')}, {row.get('env_cpu')}, {row.get('env_cpu_count')} cores")
    return sorted(found)


def runs(experiment: str, kind: str = "run") -> pd.DataFrame:
    """Successful records of one experiment (results/runs/<machine>/<experiment>.jsonl); empty if none."""
    path = runs_folder() / f"{experiment}.jsonl"
    if not path.exists():
        return pd.DataFrame()
    frame = load_records(path, kind=kind)
    if frame.empty:
        return frame
    return frame[frame["status"] == "ok"].reset_index(drop=True)


def measured(experiment: str, kind: str = "run") -> pd.DataFrame | None:
    """An experiment's records with median and IQR columns, or None (noted, with an empty table) if
    this machine has none: every script works on whatever subset of results exists."""
    frame = runs(experiment, kind=kind)
    if frame.empty:
        save(None, frame, experiment, note="no records; skipped")
        return None
    return with_spread(frame)


def with_spread(frame: pd.DataFrame, column: str = "latency_s") -> pd.DataFrame:
    """Add median, q25 and q75 columns computed from each row's raw samples in `column`."""
    stats = frame[column].apply(spread)
    return frame.assign(median=[s[0] for s in stats], q25=[s[1] for s in stats], q75=[s[2] for s in stats])


def caption(frame: pd.DataFrame) -> str:
    """Hardware and commit of the records behind a figure, for its caption."""
    def values(column: str, width: int | None = None) -> str:
        if column not in frame:
            return "?"
        return ", ".join(sorted({str(v)[:width] for v in frame[column].dropna()})) or "?"

    gpu = values("env_gpu")
    hardware = f"{values('env_cpu')} ({values('env_cpu_count')} cores)" + ("" if gpu == "?" else f", GPU {gpu}")
    return f"{hardware}; torch {values('env_torch')}; commit {values('env_git_commit', width=12)}"  # short hashes


def runs_folder() -> Path:
    """The folder of this machine's records: results/runs/<machine>/ (under $DDPBENCH_RESULTS)."""
    return results_dir() / "runs" / machine()


def job_profiles() -> dict[str, str]:
    """Which run_all.sh profile (smoke, quick, full) measured each experiment here; empty if unknown."""
    path = runs_folder() / "profile.json"  # written by experiments/profiles.py beside the records
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def where(path: Path) -> str:
    """`path` as a reader types it: relative to the repository where it lies inside it."""
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def save(fig: plt.Figure | None, table: pd.DataFrame, name: str, note: str = "") -> Path:
    """Write results/figures/<name>.png (if any) and results/tables/<name>.csv; returns the figure path.

    A `note` with an empty table (why it is empty) is kept in results/tables/<name>.note for the report.
    """
    figures, tables = results_dir() / "figures", results_dir() / "tables"
    figures.mkdir(parents=True, exist_ok=True)
    tables.mkdir(parents=True, exist_ok=True)
    table.to_csv(tables / f"{name}.csv", index=False)
    note_file = tables / f"{name}.note"
    if note and table.empty:
        note_file.write_text(note)
    else:
        note_file.unlink(missing_ok=True)  # an earlier run's reason no longer applies
    path = figures / f"{name}.png"
    if fig is not None:
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)
    if note:
        print(f"{name}: {note}")
    return path


def figure(caption_text: str, ncols: int = 1, width: float = 6.0) -> tuple[plt.Figure, list]:
    """A figure with `ncols` panels and the hardware caption underneath."""
    fig, axes = plt.subplots(1, ncols, figsize=(width * ncols, 4.2), squeeze=False)
    fig.text(0.5, -0.04, caption_text, ha="center", fontsize=7, wrap=True)
    return fig, list(axes[0])


def plain_ticks(ax, values) -> None:
    """Label a log axis at the measured values only, as plain numbers (not 3x10^0 minor labels that overlap)."""
    ax.set_xticks(values, [f"{v:g}" for v in values])
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())


def line_with_band(ax, frame: pd.DataFrame, x: str, label: str, y: str = "median") -> None:
    """Median line with an interquartile band."""
    frame = frame.sort_values(x)
    ax.plot(frame[x], frame[y], marker="o", label=label)
    if "q25" in frame and y == "median":
        ax.fill_between(frame[x], frame["q25"], frame["q75"], alpha=0.2)


def latency_against(experiment: str, x: str, xlabel: str, title: str, xscale: str = "linear",
                    per_cycle: bool = False) -> pd.DataFrame:
    """The shape E3, E5 and E7 share: median latency (IQR band) against one parameter, one panel per
    model, one line per backend and world size; `per_cycle` uses cycle_means (E5). Returns the table
    it saved (empty if no records)."""
    frame = runs(experiment)
    if per_cycle and not frame.empty:
        frame = frame.assign(latency_s=[cycle_means(s, n) for s, n in zip(frame["latency_s"], frame["sync_every"])])
    if frame.empty:
        save(None, frame, experiment, note="no records; skipped")
        return frame
    frame = with_spread(frame)
    models = sorted(frame["model"].unique())
    fig, axes = figure(caption(frame), ncols=len(models), width=5.0)
    for ax, model in zip(axes, models):
        for (backend, world_size), group in frame[frame["model"] == model].groupby(["backend", "world_size"]):
            line_with_band(ax, group, x, f"{backend}, {world_size} ranks")
        ylabel = "mean seconds per iteration per cycle (median, IQR)" if per_cycle else "seconds per iteration (median, IQR)"
        ax.set(xscale=xscale, xlabel=xlabel, ylabel=ylabel, title=f"{title}: {model}")
        if xscale in ("log", "symlog"):  # the measured values as plain numbers (1, 5, 25 MB), not 10^0
            plain_ticks(ax, sorted(frame[x].unique()))
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    table = frame[["model", "backend", "device", "world_size", x, "median", "q25", "q75", "summary_throughput",
                   "correct"]].sort_values(["model", "backend", "world_size", x])
    save(fig, table, experiment)
    return table
