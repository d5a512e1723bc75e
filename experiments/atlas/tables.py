"""The atlas's numbers from its records: each option's latency over the default's, paired round by round
within its block, with a 95% interval (stats.paired_ratio: the geometric mean of the rounds' ratios, a
Student t interval on their logs); as a CSV (one row per network, model and option) and as Markdown
(one table per network: model x option).

A network's table tests many cells at once (13 models x 10 options), so a cell is called a difference
only where it stays significant after the Benjamini-Hochberg correction over its network's cells
(false discovery rate 5%: of the cells marked, about 1 in 20 at most is expected to be noise), not
wherever its own interval excludes 1 (which ~6 of 130 cells of pure noise would do).
"""
from __future__ import annotations

import csv
import statistics
from pathlib import Path

from experiments.atlas.plan import DEFAULT, LINKS, MODELS, QUICK_MODELS, VARIANTS
from experiments.core.records import read_records
from experiments.core.stats import benjamini_hochberg, paired_ratio

CONFIDENCE = 0.95
FALSE_DISCOVERY_RATE = 0.05
COLUMNS = ["link", "model", "option", "ratio", "ci_low", "ci_high", "excludes_1", "p", "q_bh", "significant",
           "option_p50_ms", "default_p50_ms", "rounds", "option_held_mb", "default_held_mb", "memory_mb", "block",
           "session", "status"]


def latest_records(records: Path) -> dict[tuple, dict]:
    """(link, model, variant) -> the last record of it with an `atlas` section (a block measured again
    replaces what was recorded before)."""
    latest = {}
    for record in read_records(records):
        if isinstance(record.get("atlas"), dict) and isinstance(record.get("config"), dict):
            latest[(record["config"]["link"], record["atlas"]["model"], record["atlas"]["variant"])] = record
    return latest


def rows(records: Path) -> list[dict]:
    """One row per network, model and option: its ratio to the default of its own block (same session)."""
    latest = latest_records(records)
    by_session = {(r["atlas"]["session"], r["atlas"]["variant"]): r for r in read_records(records)
                  if isinstance(r.get("atlas"), dict)}
    out = []
    for (link, model, variant), record in latest.items():
        if variant == DEFAULT:
            continue
        session = record["atlas"]["session"]
        row = {"link": link, "model": model, "option": variant, "block": record["atlas"]["block"], "session": session,
               "status": record.get("status"), "ratio": None, "ci_low": None, "ci_high": None, "excludes_1": None,
               "p": None, "q_bh": None, "significant": None, "option_p50_ms": None, "default_p50_ms": None, "rounds": None,
               "option_held_mb": None, "default_held_mb": None, "memory_mb": None}
        default = by_session.get((session, DEFAULT))
        if default is not None:  # what each replica holds once trained (records before it existed: none)
            mine_mb, base_mb = record["atlas"].get("held_mb"), default["atlas"].get("held_mb")
            if mine_mb is not None and base_mb is not None:
                row.update(option_held_mb=mine_mb, default_held_mb=base_mb, memory_mb=mine_mb - base_mb)
        if record.get("status") == "ok" and default is not None and default.get("status") == "ok":
            mine, base = record["latency_s"], default["latency_s"]
            ratio = paired_ratio([[x] for x in mine], [[x] for x in base], confidence=CONFIDENCE)
            row.update(ratio=ratio["ratio"], ci_low=ratio["ci"][0], ci_high=ratio["ci"][1],
                       excludes_1=not ratio["ci"][0] <= 1 <= ratio["ci"][1], p=ratio["p"], rounds=len(mine),
                       option_p50_ms=statistics.median(mine) * 1e3, default_p50_ms=statistics.median(base) * 1e3)
        out.append(row)
    for link in {row["link"] for row in out}:  # the family: one network's cells
        family = [row for row in out if row["link"] == link and row["p"] is not None]
        for row, q in zip(family, benjamini_hochberg([row["p"] for row in family])):
            row.update(q_bh=q, significant=q < FALSE_DISCOVERY_RATE)
    return sorted(out, key=_order)


def _order(row: dict) -> tuple:
    models = [*MODELS, *QUICK_MODELS]
    link = LINKS.index(row["link"]) if row["link"] in LINKS else len(LINKS)
    return (link, row["link"], models.index(row["model"]) if row["model"] in models else len(models), row["model"],
            list(VARIANTS).index(row["option"]) if row["option"] in VARIANTS else len(VARIANTS), row["option"])


def write_csv(table: list[dict], path: Path) -> None:
    """The rows as CSV, numbers as measured (ratios to 4 digits, milliseconds to 2)."""
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        for row in table:
            writer.writerow({k: (f"{v:.4f}" if k in ("ratio", "ci_low", "ci_high") else f"{v:.2e}" if k in ("p", "q_bh")
                                 else f"{v:.2f}")
                             if isinstance(v, float) else v for k, v in row.items()})


def cell(row: dict | None) -> str:
    """A table cell: `0.97 [0.93, 1.01]`, in bold where significant after the network's Benjamini-Hochberg
    correction; `failed`, or `-` if not measured."""
    if row is None:
        return "-"
    if row["ratio"] is None:
        return "failed"
    text = f"{row['ratio']:.2f} [{row['ci_low']:.2f}, {row['ci_high']:.2f}]"
    return f"**{text}**" if row["significant"] else text


def link_name(link: str) -> str:
    """How the tables and the figure name a network."""
    return "loopback (one host)" if link == "none" else f"2 emulated hosts behind a {link} link"


def markdown(table: list[dict]) -> str:
    """One Markdown table per network: a row per model (with the default's median), a column per option."""
    parts = []
    for link in dict.fromkeys(r["link"] for r in table):
        mine = [r for r in table if r["link"] == link]
        options = list(dict.fromkeys(r["option"] for r in mine))
        models = list(dict.fromkeys(r["model"] for r in mine))
        found = {(r["model"], r["option"]): r for r in mine}
        lines = [f"### {link_name(link)}", "",
                 "| model | default p50 (ms) | " + " | ".join(options) + " |",
                 "|---|---:|" + "---:|" * len(options)]
        for model in models:
            medians = [r["default_p50_ms"] for r in mine if r["model"] == model and r["default_p50_ms"] is not None]
            default = f"{statistics.median(medians):.0f}" if medians else "-"
            lines.append(f"| {model} | {default} | " + " | ".join(cell(found.get((model, o))) for o in options) + " |")
        parts.append("\n".join(lines))
        if any(r["memory_mb"] is not None for r in mine):
            parts.append(memory_markdown(mine, models, options))
    return "\n\n".join(parts) + "\n"


def memory_cell(row: dict | None) -> str:
    """A memory cell: what the option's replica holds more (+) or less (-) than the default's, in MB."""
    return "-" if row is None or row["memory_mb"] is None else f"{row['memory_mb']:+.1f}"


def memory_markdown(mine: list[dict], models: list[str], options: list[str]) -> str:
    """One network's memory table: a row per model (what the default's replica holds), a column per option
    (its replica's difference). One measurement per block, on the slowest-holding rank: differences of
    a few MB are within the allocator's noise."""
    found = {(r["model"], r["option"]): r for r in mine}
    lines = ["Memory a replica holds once trained, per rank (MB; option minus default):", "",
             "| model | default (MB) | " + " | ".join(options) + " |", "|---|---:|" + "---:|" * len(options)]
    for model in models:
        held = [r["default_held_mb"] for r in mine if r["model"] == model and r["default_held_mb"] is not None]
        default = f"{statistics.median(held):.0f}" if held else "-"
        lines.append(f"| {model} | {default} | " + " | ".join(memory_cell(found.get((model, o))) for o in options) + " |")
    return "\n".join(lines)
