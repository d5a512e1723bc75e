# %% [markdown]
# # The report of any sweep: `ddpbench report RECORDS...`
# For records a user made with `ddpbench run` (any grid): which parameters vary, a summary table
# (each config's median, interquartile range and throughput, and its latency over a baseline config's
# with a 95% bootstrap interval), one figure per varied parameter (latency against it, one line per
# combination of the others, interquartile bands), and one line per finding. `--html` writes the same
# as one self-contained page.

# %%
from __future__ import annotations

import base64
import html
import io
import json
from dataclasses import fields
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no screen
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from analysis.common import spread  # noqa: E402
from experiments.core.config import RunConfig  # noqa: E402
from experiments.core.records import load_records  # noqa: E402
from experiments.core.stats import ratio_of_medians  # noqa: E402

PARAMETERS = [f.name for f in fields(RunConfig) if f.name != "model_hash"]
DEFAULTS = RunConfig()


def sweep_frame(paths: list[Path]) -> pd.DataFrame:
    """The successful run records of `paths` (files or folders), one row per config, with median and IQR."""
    frames = [load_records(path) for path in paths]
    frame = pd.concat([f for f in frames if not f.empty], ignore_index=True) if any(not f.empty for f in frames) \
        else pd.DataFrame()
    if frame.empty or "status" not in frame:
        return pd.DataFrame()
    frame = frame[frame["status"] == "ok"].reset_index(drop=True)
    if frame.empty:
        return frame
    stats = frame["latency_s"].apply(spread)
    return frame.assign(median=[s[0] for s in stats], q25=[s[1] for s in stats], q75=[s[2] for s in stats])


def varied(frame: pd.DataFrame) -> list[str]:
    """The config parameters that take more than one value among the records, in RunConfig's order."""
    return [p for p in PARAMETERS if p in frame and frame[p].astype(str).nunique() > 1]


def held(frame: pd.DataFrame, p: str, parameters: list[str]) -> list[str]:
    """The other varied parameters to hold fixed when `p` varies: all but those that follow from `p`
    (threads, by default the cores over the world size, change with the world size)."""
    keys = frame[parameters].astype(str)
    return [q for q in parameters if q != p and keys.groupby(keys[p])[q].nunique().max() > 1]


def baseline_row(frame: pd.DataFrame, parameters: list[str]) -> int:
    """The baseline config: the one whose varied parameters hold ddpbench's defaults where it can (25 MB
    buckets, ddp_core, sync every iteration ...), else their first values in the records."""
    def score(row) -> int:
        return sum(str(row[p]) == str(getattr(DEFAULTS, p)) for p in parameters)

    scores = frame.apply(score, axis=1)
    return int(scores.idxmax())


def label(row, parameters: list[str]) -> str:
    """A config named by its varied parameters only."""
    return ", ".join(f"{p}={_text(row[p])}" for p in parameters) or "the one config"


def _text(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def summary_table(frame: pd.DataFrame, parameters: list[str], base: int) -> pd.DataFrame:
    """Each config's median, IQR, throughput and latency ratio to the baseline config (95% interval)."""
    rows = []
    for index, row in frame.iterrows():
        ratio = ratio_of_medians(row["latency_s"], frame.loc[base, "latency_s"])
        rows.append({**{p: row[p] for p in parameters}, "median_ms": row["median"] * 1e3,
                     "q25_ms": row["q25"] * 1e3, "q75_ms": row["q75"] * 1e3,
                     "samples_per_s": row.get("summary_throughput"), "ratio_to_baseline": ratio["ratio"],
                     "ci_low": ratio["ci"][0], "ci_high": ratio["ci"][1], "baseline": index == base})
    return pd.DataFrame(rows)


def findings(frame: pd.DataFrame, parameters: list[str], base: int) -> list[str]:
    """One line per varied parameter: its fastest value, against the baseline's value of it, with the
    others held at the baseline's values (where such configs were measured)."""
    lines = []
    for p in parameters:
        others = held(frame, p, parameters)
        same = frame[(frame[others].astype(str) == frame.loc[base, others].astype(str)).all(axis=1)] if others \
            else frame
        if same[p].astype(str).nunique() < 2:
            continue
        best = same.loc[same["median"].idxmin()]
        ratio = ratio_of_medians(best["latency_s"], frame.loc[base, "latency_s"])
        context = f" (with {label(frame.loc[base], others)})" if others else ""
        if str(best[p]) == str(frame.loc[base, p]):
            lines.append(f"{p} {_text(best[p])} is the fastest{context}.")
        else:
            lines.append(f"{p} {_text(best[p])} is the fastest{context}: {ratio['ratio']:.2f}x "
                         f"[{ratio['ci'][0]:.2f}, {ratio['ci'][1]:.2f}] of {p} {_text(frame.loc[base, p])}.")
    return lines


def figure_for(frame: pd.DataFrame, p: str, parameters: list[str]) -> plt.Figure:
    """Median latency against parameter `p`, one line per combination of the other varied parameters,
    with interquartile bands."""
    fig, ax = plt.subplots(figsize=(6, 4))
    others = held(frame, p, parameters)
    numeric = pd.api.types.is_numeric_dtype(frame[p])
    groups = frame.groupby(others, sort=True) if others else [((), frame)]
    for key, group in groups:
        group = group.sort_values(p) if numeric else group
        x = group[p] if numeric else group[p].astype(str)
        name = ", ".join(f"{q}={_text(v)}" for q, v in zip(others, key if isinstance(key, tuple) else (key,)))
        ax.plot(x, group["median"] * 1e3, marker="o", label=name or "median")
        ax.fill_between(x, group["q25"] * 1e3, group["q75"] * 1e3, alpha=0.2)
    if numeric:
        values = sorted(frame[p].unique())
        ax.set_xticks(values, [_text(v) for v in values])
    ax.set(xlabel=p, ylabel="ms per iteration (median, IQR)", title=f"latency against {p}")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    return fig


def markdown(table: pd.DataFrame, lines: list[str], figures: dict[str, str], sources: list[Path]) -> str:
    """The report as Markdown: findings, the summary table, the figures."""
    def cell(value) -> str:
        return f"{value:.4g}" if isinstance(value, float) else str(value)

    out = ["# ddpbench sweep report", "", f"Records: {', '.join(f'`{s}`' for s in sources)}. Ratios are "
           "medians of per-iteration latency over the baseline config's, with a 95% bootstrap interval.", "",
           "## Findings", ""]
    out += [f"- {line}" for line in lines] or ["- Nothing varies enough to compare."]
    out += ["", "## Configs", "", "| " + " | ".join(table.columns) + " |", "|" + "---|" * len(table.columns)]
    out += ["| " + " | ".join(cell(v) for v in row) + " |" for row in table.itertuples(index=False)]
    out += ["", "## Figures", ""] + [f"![{p}]({name})" for p, name in figures.items()]
    return "\n".join(out) + "\n"


def html_page(text: str, images: dict[str, bytes]) -> str:
    """One self-contained page: the Markdown's content, with every figure inlined."""
    body = []
    for line in text.splitlines():
        if line.startswith("# "):
            body.append(f"<h1>{html.escape(line[2:])}</h1>")
        elif line.startswith("## "):
            body.append(f"<h2>{html.escape(line[3:])}</h2>")
        elif line.startswith("- "):
            body.append(f"<p>&bull; {html.escape(line[2:])}</p>")
        elif line.startswith("|") and not line.startswith("|---"):
            cells = "".join(f"<td>{html.escape(c.strip())}</td>" for c in line.strip("|").split("|"))
            body.append(f"<tr>{cells}</tr>")
        elif line.startswith("!["):
            name = line[line.index("(") + 1:-1]
            data = base64.b64encode(images[name]).decode()
            body.append(f'<img alt="{html.escape(name)}" src="data:image/png;base64,{data}">')
        elif line.strip():
            body.append(f"<p>{html.escape(line)}</p>")
    joined, rows = [], []
    for part in body:  # table rows into one table
        if part.startswith("<tr>"):
            rows.append(part)
            continue
        if rows:
            joined.append("<table>" + "".join(rows) + "</table>")
            rows = []
        joined.append(part)
    if rows:
        joined.append("<table>" + "".join(rows) + "</table>")
    style = "body{font-family:sans-serif;max-width:70em;margin:2em auto}td{border:1px solid #ccc;padding:2px 6px}"
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>ddpbench sweep report</title>"
            f"<style>{style}</style></head><body>{''.join(joined)}</body></html>\n")


def write_report(paths: list[Path], out: Path, with_html: bool = False) -> list[str]:
    """Write report.md, summary.csv and one figure per varied parameter (and index.html) under `out`;
    returns the findings. ValueError where the records hold no successful run."""
    frame = sweep_frame(paths)
    if frame.empty:
        raise ValueError(f"no successful run records in {', '.join(map(str, paths))}")
    parameters = varied(frame)
    base = baseline_row(frame, parameters)
    table = summary_table(frame, parameters, base)
    lines = findings(frame, parameters, base)
    out.mkdir(parents=True, exist_ok=True)
    table.to_csv(out / "summary.csv", index=False)
    figures, images = {}, {}
    for p in parameters:
        fig = figure_for(frame, p, parameters)
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
        plt.close(fig)
        figures[p] = f"latency-{p}.png"
        images[figures[p]] = buffer.getvalue()
        (out / figures[p]).write_bytes(buffer.getvalue())
    text = markdown(table, lines, figures, paths)
    (out / "report.md").write_text(text)
    (out / "findings.json").write_text(json.dumps(lines, indent=1) + "\n")
    if with_html:
        (out / "index.html").write_text(html_page(text, images))
    return lines
