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
import io
import json
import math
import re
from dataclasses import fields
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no screen
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from markdown_it import MarkdownIt  # noqa: E402

from experiments.core.config import RunConfig  # noqa: E402
from experiments.core.drift import drift_file, stored_drift  # noqa: E402
from experiments.core.records import load_records  # noqa: E402
from experiments.core.stats import holm, launch_ratio, ratio_of_medians, spread  # noqa: E402

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


def derived(frame: pd.DataFrame, parameters: list[str]) -> dict[str, str]:
    """The varied parameters that follow from another one, each with the one it follows from (threads
    from the world size): their values tell nothing the other's do not, so they get no finding of their
    own. Where two follow from each other, the one later in RunConfig's order is the derived one."""
    keys = frame[parameters].astype(str)
    found = {}
    for p in parameters:
        for q in parameters:
            if q == p or q in found:
                continue
            p_from_q = keys.groupby(keys[q])[p].nunique().max() == 1
            q_from_p = keys.groupby(keys[p])[q].nunique().max() == 1
            if p_from_q and (not q_from_p or parameters.index(q) < parameters.index(p)):
                found[p] = q
                break
    return found


def baseline_row(frame: pd.DataFrame, parameters: list[str]) -> int:
    """The baseline config: the one whose varied parameters hold ddpbench's defaults where it can (25 MB
    buckets, PyTorch's DDP, sync every iteration ...), else their first values in the records."""
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
    """Each config's median, IQR, throughput, peak memory per rank and latency ratio to the baseline config
    (95% interval)."""
    rows = []
    for index, row in frame.iterrows():
        ratio = ratio_of_medians(row["latency_s"], frame.loc[base, "latency_s"])
        rows.append({**{p: row[p] for p in parameters}, "median_ms": row["median"] * 1e3,
                     "q25_ms": row["q25"] * 1e3, "q75_ms": row["q75"] * 1e3,
                     "samples_per_s": row.get("summary_throughput"),
                     # the largest rank's peak over the measured iterations (None: records before it existed)
                     "peak_mb_per_rank": row.get("peak_memory_mb"), "ratio_to_baseline": ratio["ratio"],
                     "ci_low": ratio["ci"][0], "ci_high": ratio["ci"][1], "baseline": index == base})
    return pd.DataFrame(rows)


def samples_per_iteration(row) -> float:
    """Samples one iteration trains over all ranks: the per-rank batch times the world size."""
    return float(row["batch_size"]) * float(row["world_size"])


def throughput_ratio(frame: pd.DataFrame, i: int, base: int, drift: dict | None) -> dict:
    """Config i's throughput (samples/s over all ranks) over the baseline's, with a 95% interval and the
    p-value of no difference in throughput: from this machine's launch-to-launch drift where stored (each
    config is one launch), else from the bootstrap over iterations."""
    work = samples_per_iteration(frame.loc[i]) / samples_per_iteration(frame.loc[base])
    if drift:
        r = launch_ratio([frame.loc[i, "median"]], [frame.loc[base, "median"]], 0.95, drift["sd"], drift["df"],
                         null=work)
    else:
        r = ratio_of_medians(frame.loc[i, "latency_s"], frame.loc[base, "latency_s"], null=work)
    ranks = float(frame.loc[i, "world_size"]) / float(frame.loc[base, "world_size"])
    return {"ratio": work / r["ratio"], "ci": [work / r["ci"][1], work / r["ci"][0]], "p": r["p"], "ranks": ranks}


def findings(frame: pd.DataFrame, parameters: list[str], base: int, drift: dict | None = None) -> list[str]:
    """One line per varied parameter that does not follow from another: its values of the highest and
    the lowest throughput (samples/s, so that world sizes and batch sizes compare fairly), each against
    the baseline's value, the others held at the baseline's values; the table's largest difference from
    the baseline, if no line names it yet; each marked "not significant" unless it stays significant
    after Holm's correction over all of them; and a last line saying how significance was decided."""
    follows = derived(frame, parameters)
    tests = []  # (parameter or None, row, what)
    for p in (q for q in parameters if q not in follows):
        others = held(frame, p, parameters)
        # (compared as text column by column: a row of mixed ints and floats would turn 2 into "2.0")
        keys = frame[others].astype(str)
        same = frame[(keys == keys.loc[base]).all(axis=1)] if others else frame
        if same[p].astype(str).nunique() < 2:
            continue
        speed = same.apply(samples_per_iteration, axis=1) / same["median"]
        for what, i in (("highest", speed.idxmax()), ("lowest", speed.idxmin())):
            if not any(t[1] == i and t[0] == p for t in tests):
                tests.append((p, i, what))
    ratios = {i: throughput_ratio(frame, i, base, drift) for i in frame.index if i != base}
    if ratios:
        largest = max(ratios, key=lambda i: abs(math.log(ratios[i]["ratio"])))
        if not any(t[1] == largest for t in tests):
            tests.append((None, largest, "largest"))
    tested = [t for t in tests if t[1] != base]
    adjusted = dict(zip([t[1] for t in tested], holm([ratios[t[1]]["p"] for t in tested])))
    lines = []
    for p, i, what in tests:
        row = frame.loc[i]
        if p is None:
            head = f"The largest difference in the table: {label(row, [q for q in parameters if q not in follows])}"
        else:
            others = held(frame, p, parameters)
            shown = [q for q in others if q not in follows]
            context = f" (with {label(frame.loc[base], shown)})" if shown else ""
            if i == base:
                lines.append(f"{p} {_text(row[p])}, the baseline's, has the {what} throughput{context}.")
                continue
            head = f"{p} {_text(row[p])} has the {what} throughput{context}"
        r = ratios[i]
        against = f"{p} {_text(frame.loc[base, p])}" if p else "the baseline"
        text = f"{head}: {r['ratio']:.2f}x [{r['ci'][0]:.2f}, {r['ci'][1]:.2f}] the samples/s of {against}"
        if r["ranks"] != 1 and p == "world_size":  # scaling efficiency: the larger world size's throughput per rank over the smaller's
            sizes = sorted((int(row["world_size"]), int(frame.loc[base, "world_size"])))
            up = r["ranks"] > 1
            low, high = ((r["ci"][0] / r["ranks"], r["ci"][1] / r["ranks"]) if up
                         else (r["ranks"] / r["ci"][1], r["ranks"] / r["ci"][0]))
            text += (f"; per-rank efficiency of {sizes[1]} ranks over {sizes[0]}: "
                     f"{(r['ratio'] / r['ranks']) if up else (r['ranks'] / r['ratio']):.2f} [{low:.2f}, {high:.2f}]")
        significant = adjusted[i] < 0.05 and not r["ci"][0] <= 1 <= r["ci"][1]
        lines.append(text + ("." if significant else " - not significant."))
    if tested:
        source = (f"this machine's launch-to-launch drift ({drift['sd']:.1%}, {drift['file']}), each config being "
                  "one launch" if drift else "the bootstrap over each config's iterations, which holds the noise "
                  "within one launch only (no launch-to-launch drift is stored for this machine: `ddpbench drift`)")
        lines.append(f"Significance: Holm's correction over these {len(tested)} comparisons (family-wise 5%); "
                     f"95% intervals from {source}."
                     + (f" Not reported on their own: {', '.join(f'{p} (follows from {q})' for p, q in follows.items())}."
                        if follows else ""))
    return lines


def records_drift(frame: pd.DataFrame) -> dict | None:
    """The stored launch-to-launch drift of the one machine that made every record, or None."""
    machines = {(m, i) for m, i in zip(frame.get("env_machine", [None]), frame.get("env_machine_id", [None]))}
    if len(machines) != 1 or None in next(iter(machines)) or any(pd.isna(v) for v in next(iter(machines))):
        return None
    name, ident = next(iter(machines))
    return stored_drift(drift_file(name), ident)


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


# Markdown's inline markup characters, escaped with a backslash in text that comes from records (config
# strings such as a model spec, paths): shown as themselves, never as emphasis, code, links, HTML or a
# table's cell border. `_` only where it could start or end emphasis, so that `bucket_mb` stays readable.
_MARKUP = re.compile(r"([\\`*\[\]<>|&#])|(?<![0-9A-Za-z])_|_(?![0-9A-Za-z])")


def escape(text: str) -> str:
    """`text` as Markdown that shows it literally, on one line (inside a table cell too: `|` becomes `\\|`)."""
    return _MARKUP.sub(lambda m: "\\" + m.group(0), " ".join(text.splitlines()))


def code(text: str) -> str:
    """`text` as a Markdown code span, fenced with more backticks than any run of them inside it."""
    fence = "`" * (max((len(run) for run in re.findall("`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _inline(line: str) -> str:
    """A finding as Markdown: the commands it names (`ddpbench drift`) as code, all else escaped, config
    values included (a backtick in a model spec is shown, not taken for code)."""
    parts = re.split(r"(`ddpbench [a-z -]+`)", line)
    return "".join(part if i % 2 else escape(part) for i, part in enumerate(parts))


def markdown(table: pd.DataFrame, lines: list[str], figures: dict[str, str], sources: list[Path]) -> str:
    """The report as Markdown: findings, the summary table, the figures."""
    def cell(value) -> str:
        return escape(f"{value:.4g}" if isinstance(value, float) else str(value))

    out = ["# ddpbench sweep report", "", f"Records: {', '.join(code(str(s)) for s in sources)}. Findings compare "
           "throughput (samples/s over all ranks) with the baseline config's; the table's ratios are medians of "
           "per-iteration latency over the baseline's, with a 95% bootstrap interval over iterations (one launch "
           "each).", "", "## Findings", ""]
    out += [f"- {_inline(line)}" for line in lines] or ["- Nothing varies enough to compare."]
    out += ["", "## Configs", "", "| " + " | ".join(escape(str(c)) for c in table.columns) + " |",
            "|" + "---|" * len(table.columns)]
    out += ["| " + " | ".join(cell(v) for v in row) + " |" for row in table.itertuples(index=False)]
    out += ["", "## Figures", ""] + [f"![{p}]({name})" for p, name in figures.items()]
    return "\n".join(out) + "\n"


# CommonMark with GitHub's tables; raw HTML off, so that any markup in the text is shown escaped, not run.
_RENDERER = MarkdownIt("commonmark", {"html": False}).enable("table")

STYLE = ("body{font-family:sans-serif;max-width:70em;margin:2em auto}table{border-collapse:collapse}"
         "th,td{border:1px solid #ccc;padding:2px 6px}th{background:#f4f4f4}img{max-width:100%}")


def html_page(text: str, images: dict[str, bytes]) -> str:
    """One self-contained page: the Markdown rendered by markdown-it-py, with every figure inlined."""
    tokens = _RENDERER.parse(text)
    for token in tokens:
        for child in token.children or []:
            if child.type == "image" and child.attrGet("src") in images:
                data = base64.b64encode(images[child.attrGet("src")]).decode()
                child.attrSet("src", f"data:image/png;base64,{data}")
    body = _RENDERER.renderer.render(tokens, _RENDERER.options, {})
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>ddpbench sweep report</title>"
            f"<style>{STYLE}</style></head><body>\n{body}</body></html>\n")


def write_report(paths: list[Path], out: Path, with_html: bool = False) -> list[str]:
    """Write report.md, summary.csv and one figure per varied parameter (and index.html) under `out`;
    returns the findings. ValueError where the records hold no successful run."""
    frame = sweep_frame(paths)
    if frame.empty:
        raise ValueError(f"no successful run records in {', '.join(map(str, paths))}")
    parameters = varied(frame)
    base = baseline_row(frame, parameters)
    table = summary_table(frame, parameters, base)
    lines = findings(frame, parameters, base, records_drift(frame))
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
