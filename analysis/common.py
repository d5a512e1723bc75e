"""What every analysis script shares: where results live, loading them, medians with spread, saving.

Analysis reads only `results/` (through the package's record reader) and never imports the harness.
Set DDPBENCH_RESULTS to read and write another results folder (the tests do); every script also takes
`--records PATH` and `--out FOLDER` (script_main).
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import os
import sys
from pathlib import Path
from typing import Callable

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
RUNS = "runs/{machine}"  # where a results folder keeps one machine's records of the main job
_chosen: dict[str, Path] = {}  # the running script's --records and --out (script_main); empty: the defaults


class NoRecords(Exception):
    """Records a script needs are missing: `path` is where it looked, `make` the command that makes them,
    `why` (if any) what it looked for there."""

    def __init__(self, path: Path, make: str, why: str = ""):
        super().__init__(f"no records at {where(path)}" + (f" ({why})" if why else ""))
        self.path, self.make = path, make


def script_main(argv: list[str] | None, draw: Callable[[], object], make: str, records: str = RUNS,
                needs: tuple[str, ...] = ()) -> int:
    """The command line of every analysis script: `--records PATH`, a records file or folder (default
    `records` under the results folder, {machine} this machine's name) and `--out FOLDER`, where figures/
    and tables/ go (default the results folder); then draw() with those, and 0.

    Records missing or empty (for a runs folder: no <need>.jsonl of any of `needs`, glob patterns; a file
    there is read as the experiment it is named after), or a NoRecords out of draw(): one line on stderr
    naming the path looked at, `make` (the command that makes them) and the reference machine's copy
    where the project has one, and 2.
    """
    name = Path(sys.modules[draw.__module__].__file__).stem
    default = results_dir() / records.format(machine=machine())
    parser = argparse.ArgumentParser(prog=f"python analysis/{name}.py", description=(draw.__doc__ or "").strip())
    parser.add_argument("--records", type=Path, default=default, metavar="PATH",
                        help=f"the records to draw, a file or folder (default {where(default)})")
    parser.add_argument("--out", type=Path, default=results_dir(), metavar="FOLDER",
                        help=f"where figures/ and tables/ go (default {where(results_dir())})")
    args = parser.parse_args(argv)
    previous = dict(_chosen)
    _chosen.update(records=args.records, out=args.out)
    if records == RUNS:
        _chosen["runs"] = args.records
    try:
        _check_records(args.records, needs, make)
        draw()
    except NoRecords as missing:
        print(f"{name}: {missing}; make them with {missing.make}{_reference_hint(missing.path, records, needs)}",
              file=sys.stderr)
        return 2
    finally:
        _chosen.clear()
        _chosen.update(previous)
    return 0


def _holds_records(file: Path) -> bool:
    """Whether `file` has a line that is not blank (stops at the first one)."""
    with file.open("rb") as lines:
        return any(line.strip() for line in lines)


def _check_records(path: Path, needs: tuple[str, ...], make: str) -> None:
    """NoRecords unless `path` holds records: a file (named after one of `needs`, if any) or a folder
    with a non-empty <need>.jsonl (any *.jsonl under it without `needs`)."""
    wanted = "{" + ",".join(needs) + "}.jsonl" if len(needs) > 1 else f"{needs[0]}.jsonl" if needs else ""
    if not path.exists():
        raise NoRecords(path, make)
    if path.is_file():
        if needs and not any(fnmatch.fnmatch(path.stem, n) for n in needs):
            raise NoRecords(path, make, why=f"a file is read as the experiment it is named after: {wanted}")
        if not _holds_records(path):
            raise NoRecords(path, make)
        return
    files = [f for n in needs for f in path.glob(f"{n}.jsonl")] if needs else list(path.rglob("*.jsonl"))
    if not any(f.is_file() and _holds_records(f) for f in files):
        raise NoRecords(path / wanted if needs else path, make)


def _reference_hint(looked_at: Path, records: str, needs: tuple[str, ...]) -> str:
    """", or draw the reference machine's: --records results/reference/<m>/..." where the project's
    committed results hold what was missing (and it was not looked for there)."""
    reference = ROOT / "results" / "reference"
    if not reference.is_dir() or reference in looked_at.resolve().parents:
        return ""
    for folder in sorted(p for p in reference.iterdir() if p.is_dir()):
        candidate = folder / records.format(machine=folder.name)
        try:
            _check_records(candidate, needs, "")
        except NoRecords:
            continue
        return f" (or draw the reference machine's: --records {where(candidate)})"
    return ""


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
    """Successful records of one experiment (results/runs/<machine>/<experiment>.jsonl, or the --records
    folder's, or the --records file named after it); empty if none."""
    folder = runs_folder()
    path = folder if folder.is_file() and folder.stem == experiment else folder / f"{experiment}.jsonl"
    if not path.is_file():
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
    """The folder of this machine's records: results/runs/<machine>/ (under $DDPBENCH_RESULTS), or the
    running script's --records."""
    return _chosen.get("runs", results_dir() / "runs" / machine())


def chosen_records() -> Path:
    """The running script's --records (script_main)."""
    return _chosen["records"]


def output_dir() -> Path:
    """Where figures/, tables/ and the report go: the running script's --out, else the results folder."""
    return _chosen.get("out", results_dir())


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
    """Write <out>/figures/<name>.png (if any) and <out>/tables/<name>.csv, <out> the results folder or
    --out; returns the figure path. A `note` with an empty table (why it is empty) is kept in
    <out>/tables/<name>.note for the report.
    """
    figures, tables = output_dir() / "figures", output_dir() / "tables"
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
