"""`ddpbench history REVISIONS... [--preset smoke]`: latency per commit, recorded and plotted.

REVISIONS are commits or ranges (`HEAD~6..HEAD`, oldest first), in the order given. Each commit not
yet recorded is checked out in a temporary worktree (as `ab` does) and runs the preset over several
rounds. The commits measured together run interleaved, c1 c2 ... cn in even rounds and cn ... c1 in
odd ones, so that neighbours run back to back and compare pairs them round by round (one session).

Records: results/history/<machine>/<preset>/<commit>.jsonl, one file per commit (full hash): the
preset's run records of each round (tagged `"round": {"session", "index"}`, `env.git_commit` is the
commit), then a closing record `{"kind": "history", "status": "ok" | "failed", "commit", "preset",
"rounds", "session", "error"}`. A commit with a closing record is skipped; a file without one is
measured again. A measurement is written to `<commit>.jsonl.partial` and replaces the commit's file
only when complete, so an interrupted one leaves the earlier file as it was. A commit that cannot run the preset (older than the runner, or
broken) is recorded as failed after its first failing round.

Then, for all the given commits: a table (results/tables/history-<machine>.csv) and a figure
(results/figures/history-<machine>.png; `-<preset>` added for presets other than smoke) of the median
latency per config with its interquartile range, and compare's verdict of each commit against the
previous successfully measured one marked; with `--html DIR`, also a static page (page.py).
Exit status: 0, 1 if a record cannot be written (a full disk), or 2 on bad input.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from experiments.core.config import ConfigError
from experiments.core.git import commits_in_range, git, resolve_commit
from experiments.core.machine import machine_name
from experiments.core.records import RecordWriteError, append_record, read_records
from experiments.regression.ab import PRESETS, QUIET, QUIET_RETRIES, preset_args, run_round, worktrees
from experiments.regression.compare import MARKS, check_verdict_options, compare, describe, pooled_samples

ROOT = Path(__file__).resolve().parents[2]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `history` sub-command's options."""
    parser.add_argument("revisions", nargs="+", help="commits or ranges A..B (oldest first), e.g. HEAD~6..HEAD")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="smoke")
    parser.add_argument("--rounds", type=int, help="rounds per commit (default: the preset's, as for ab)")
    parser.add_argument("--threshold", type=float, default=0.05, help="verdict threshold (as for compare)")
    parser.add_argument("--confidence", type=float, default=0.99)
    parser.add_argument("--results", type=Path, default=ROOT / "results",
                        help="results folder: history/, figures/ and tables/ under it (default results/)")
    parser.add_argument("--busy-retries", type=int, default=QUIET_RETRIES,
                        help=f"runs again a run during which other processes kept more than {QUIET} cores busy, "
                             f"at most this many times (default {QUIET_RETRIES})")
    parser.add_argument("--html", type=Path, metavar="DIR",
                        help="also write a static, self-contained page here (index.html, records/), as asv publish")
    parser.add_argument("--repo", type=Path, default=ROOT, help=argparse.SUPPRESS)


@dataclass(frozen=True)
class HistoryOptions:
    """Which commits `ddpbench history` measures, how, and where it writes (its flags, typed)."""

    revisions: list[str]
    preset: str = "smoke"
    rounds: int | None = None
    threshold: float = 0.05
    confidence: float = 0.99
    results: Path = ROOT / "results"
    busy_retries: int = QUIET_RETRIES
    html: Path | None = None
    repo: Path = ROOT


def resolve(revisions: list[str], repo: Path) -> list[str]:
    """Full hashes of the given commits and ranges, in order, without repeats; ConfigError if one is bad."""
    commits: list[str] = []
    for rev in revisions:
        if ".." in rev:
            found = commits_in_range(rev, repo)
            if not found:
                raise ConfigError(f"revision range {rev!r} selects no commits")
        else:
            found = [resolve_commit(rev, repo)]
        commits += [c for c in found if c not in commits]
    return commits


def closing_record(path: Path, preset: str) -> dict | None:
    """The record that marks a commit's file as complete with the preset as it is defined now, or None
    (a preset whose arguments changed since measures something else: that commit is measured again)."""
    if not path.exists():
        return None
    closing = next((r for r in read_records(path) if r.get("kind") == "history"), None)
    return closing if closing is not None and closing.get("args") == preset_args(preset) else None


def measure(commits: list[str], folder: Path, preset: str, rounds: int, repo: Path,
            retries: int = QUIET_RETRIES) -> None:
    """Run the preset on every commit that has no complete record yet, interleaved over rounds.

    A commit's new records go to `<commit>.jsonl.partial` beside its file, which replaces the file only
    once the closing record is in: an interrupted re-measure leaves the earlier records as they were,
    and no file that counts as complete (readers and closing_record look at *.jsonl only).
    """
    pending = [c for c in commits if closing_record(folder / f"{c}.jsonl", preset) is None]
    if not pending:
        return
    folder.mkdir(parents=True, exist_ok=True)
    partial = {c: folder / f"{c}.jsonl.partial" for c in pending}
    for path in partial.values():
        path.unlink(missing_ok=True)  # left by a run killed outright: start it afresh
    session = f"history-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
    failed: dict[str, str] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="ddpbench-history-") as tmp:
            with worktrees(repo, {c: c for c in pending}, Path(tmp)) as trees:
                for index in range(rounds):
                    for commit in pending if index % 2 == 0 else pending[::-1]:
                        if commit in failed:
                            continue
                        print(f"history round {index + 1}/{rounds}: {commit[:10]}", file=sys.stderr, flush=True)
                        error = run_round(trees[commit], preset, partial[commit],
                                          {"session": session, "index": index}, retries=retries)
                        if error:
                            print(f"history: {commit[:10]} cannot run the {preset} preset; recorded as failed",
                                  file=sys.stderr, flush=True)
                            failed[commit] = error
        for commit in pending:
            append_record(partial[commit], {
                "kind": "history", "status": "failed" if commit in failed else "ok", "commit": commit,
                "preset": preset, "args": preset_args(preset), "rounds": rounds, "session": session,
                "error": failed.get(commit)})
            os.replace(partial[commit], folder / f"{commit}.jsonl")  # complete: now it counts
    finally:
        for path in partial.values():  # interrupted: what was measured so far is not a result
            path.unlink(missing_ok=True)


def table_rows(commits: list[str], folder: Path, repo: Path, preset: str, threshold: float,
               confidence: float) -> list[dict]:
    """Per commit and config: median latency with its quartiles, and the verdict against the previous
    successfully measured commit (compare's statistics: paired when measured in one session)."""
    rows, previous = [], None
    for commit in commits:
        path = folder / f"{commit}.jsonl"
        closing = closing_record(path, preset) or {"status": "missing", "error": "not measured with this preset"}
        base = {"commit": commit[:10], "subject": git("log", "-1", "--format=%s", commit, cwd=repo)[:60],
                "status": closing["status"]}
        if closing["status"] != "ok":
            error = (closing.get("error") or "").strip().splitlines()
            rows.append({**base, "error": error[-1] if error else ""})
            continue
        verdicts = {}
        if previous is not None:
            try:
                verdicts = {describe(r["config"]): r
                            for r in compare(previous, path, threshold, confidence, strict=False)}
            except ConfigError:
                pass  # no configs in common: nothing to compare
        for entry in pooled_samples(path, strict=False).values():  # unreadable lines: skipped, with a warning
            name = describe(entry["config"])
            q25, q50, q75 = np.percentile(entry["samples"], [25, 50, 75]) * 1e3
            row = {**base, "config": name, "n": len(entry["samples"]), "rounds": len(entry["rounds"]),
                   "p50_ms": q50, "p25_ms": q25, "p75_ms": q75}
            if name in verdicts:
                v = verdicts[name]
                row.update(method=v["method"], verdict=v["verdict"])
                if v["ci"] is not None:  # (None: one launch each and no stored drift; cannot tell)
                    row.update(ratio=v["ratio"], ci_low=v["ci"][0], ci_high=v["ci"][1])
            rows.append(row)
        previous = path
    return rows


def plot(rows: list[dict], commits: list[str], figure: Path, title: str) -> None:
    """Median latency per commit (interquartile bars), one panel per config, verdicts marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    configs = sorted({r["config"] for r in rows if "config" in r})
    labels = [c[:7] for c in commits]
    fig, axes = plt.subplots(len(configs) or 1, 1, figsize=(max(6, 1.1 * len(commits)), 3 * max(1, len(configs))),
                             sharex=True, squeeze=False)
    styles = {"slower": ("^", "tab:red", "+ slower than the previous commit"),
              "faster": ("v", "tab:green", "- faster than the previous commit"),
              "not significant": ("o", "0.6", "~ not significant (ratio shown)")}
    for ax, config in zip(axes[:, 0], configs):
        mine = [r for r in rows if r.get("config") == config]
        x = [labels.index(r["commit"][:7]) for r in mine]
        y = np.array([r["p50_ms"] for r in mine])
        spread = np.array([[r["p50_ms"] - r["p25_ms"] for r in mine], [r["p75_ms"] - r["p50_ms"] for r in mine]])
        ax.errorbar(x, y, yerr=spread, fmt="-o", color="tab:blue", capsize=3, label="median, 25-75%")
        for xi, r in zip(x, mine):
            if r.get("verdict") in styles:
                marker, color, _ = styles[r["verdict"]]
                ax.plot(xi, r["p75_ms"] * 1.06, marker=marker, color=color, markersize=7, linestyle="none")
                ax.annotate(f"{r['ratio']:.2f}", (xi, r["p75_ms"] * 1.06), textcoords="offset points",
                            xytext=(0, 6), ha="center", fontsize=7, color=color)
        for xi, r in enumerate(rows_by_commit(rows, commits)):
            if r is not None and r["status"] != "ok":
                ax.axvspan(xi - 0.4, xi + 0.4, color="0.85")
                ax.text(xi, 0.02, "failed", transform=ax.get_xaxis_transform(), ha="center", fontsize=7)
        ax.set_ylabel("latency (ms)")
        ax.set_title(config, fontsize=9)
        ax.set_ylim(0, 1.3 * max(r["p75_ms"] for r in mine))
    handles = [plt.Line2D([], [], marker=m, color=c, linestyle="none", label=label) for m, c, label in styles.values()]
    axes[0, 0].legend(handles=[*axes[0, 0].get_legend_handles_labels()[0], *handles], fontsize=7, loc="lower left")
    axes[-1, 0].set_xticks(range(len(labels)), labels, rotation=45, fontsize=8)
    axes[-1, 0].set_xlabel("commit (oldest first)")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    figure.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(figure, dpi=120)
    plt.close(fig)


def rows_by_commit(rows: list[dict], commits: list[str]) -> list[dict | None]:
    """The first row of each commit (None if it has none)."""
    return [next((r for r in rows if r["commit"] == c[:10]), None) for c in commits]


def main(options: HistoryOptions) -> int:
    """Measure what is missing, then write the table and the figure; 2 on bad input."""
    from experiments.args import check_folder  # cli imports this module

    rounds = options.rounds if options.rounds is not None else PRESETS[options.preset]["rounds"]
    try:
        if rounds < 1:
            raise ConfigError(f"--rounds={rounds} is not allowed; it must be >= 1")
        check_verdict_options(options.threshold, options.confidence)
        if options.busy_retries < 0:
            raise ConfigError(f"--busy-retries={options.busy_retries} is not allowed; it must be >= 0")
        commits = resolve(options.revisions, options.repo)
        check_folder(options.results, "results")  # records, table and figure go under it
        if options.html is not None:
            check_folder(options.html, "html")
    except ConfigError as error:
        print(f"ddpbench history: error: {error}", file=sys.stderr)
        return 2
    machine = machine_name()
    folder = options.results / "history" / machine / options.preset
    try:
        measure(commits, folder, options.preset, rounds, options.repo, options.busy_retries)
    except RecordWriteError as error:  # a full disk: the earlier records of every commit are as they were
        print(f"ddpbench history: error: {error}", file=sys.stderr)
        return 1
    rows = table_rows(commits, folder, options.repo, options.preset, options.threshold, options.confidence)
    suffix = "" if options.preset == "smoke" else f"-{options.preset}"
    table = options.results / "tables" / f"history-{machine}{suffix}.csv"
    figure = options.results / "figures" / f"history-{machine}{suffix}.png"
    import pandas as pd

    table.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(table, index=False, float_format="%.4g")
    plot(rows, commits, figure, f"ddpbench history, {options.preset} preset, {machine}")
    for row in rows:
        if row["status"] != "ok":
            print(f"  {row['commit']} {'failed':>30}  {row['subject']}: {row['error']}")
            continue
        mark = MARKS.get(row.get("verdict"), " ")
        change = f"{row['ratio']:.3f} [{row['ci_low']:.3f}, {row['ci_high']:.3f}]" if "ratio" in row else ""
        print(f"{mark} {row['commit']} {row['p50_ms']:8.2f}ms {change:>22}  {row['config'].split()[0]:12} "
              f"{row['subject']}")
    print(f"records in {folder}; table {table}; figure {figure}")
    if options.html is not None:
        from experiments.regression import page

        title = f"ddpbench history, {options.preset} preset, {machine}"
        print(f"page {page.write(rows, commits, folder, options.html, title)}")
    return 0
