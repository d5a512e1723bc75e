"""`ddpbench history --html DIR`: the history as one static, self-contained page, as `asv publish` makes.

DIR/index.html holds everything it shows (styles, script and data inline; nothing fetched from the
network), so a CI job can publish DIR as it is. The records of every commit shown are copied to
DIR/records/<commit>.jsonl and linked from the page. The page has:
- per config, a chart of the median latency per commit (oldest first) with its interquartile range,
  and compare's verdict against the previous measured commit marked (ratio and interval on hover);
- a table of the last commits, newest first: each config's median, ratio [interval] and mark, and a
  link to the commit's records.
The charts are drawn by a small script from the data embedded in the page; the table is plain HTML.
"""
from __future__ import annotations

import html
import json
import shutil
import time
from pathlib import Path

from experiments.regression.compare import MARKS

LAST_COMMITS = 30  # rows of the table

STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em auto; max-width: 1100px; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.1em; margin-top: 1.5em; }
.chart { border: 1px solid #ddd; margin: .5em 0 1em; }
table { border-collapse: collapse; width: 100%; font-size: 13px; }
th, td { border-bottom: 1px solid #e4e4e4; padding: 3px 6px; text-align: left; vertical-align: top; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.slower { color: #c62828; font-weight: bold; } .faster { color: #2e7d32; font-weight: bold; }
.failed { color: #888; } .legend span { margin-right: 1.5em; } code { font-size: 12px; }
"""

# Draws one SVG chart per config from the embedded data; every chart says which config it is.
SCRIPT = """
(function () {
  const data = JSON.parse(document.getElementById('history-data').textContent);
  const colors = {slower: '#c62828', faster: '#2e7d32', 'not significant': '#999', unchanged: '#1565c0'};
  const ns = 'http://www.w3.org/2000/svg';
  function el(name, attrs, parent) {
    const e = document.createElementNS(ns, name);
    for (const k in attrs) e.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(e);
    return e;
  }
  const holder = document.getElementById('charts');
  data.configs.forEach(function (config) {
    const points = data.rows.filter(function (r) { return r.config === config; });
    const section = document.createElement('section');
    section.className = 'config';
    section.dataset.config = config;
    const h = document.createElement('h2');
    h.textContent = config;
    section.appendChild(h);
    const W = 1000, H = 260, L = 60, R = 20, T = 20, B = 60;
    const svg = el('svg', {width: W, height: H, class: 'chart', role: 'img'}, section);
    const top = Math.max.apply(null, points.map(function (p) { return p.p75_ms; })) * 1.15;
    const x = function (i) { return L + (data.commits.length < 2 ? 0.5 : i / (data.commits.length - 1)) * (W - L - R); };
    const y = function (v) { return T + (1 - v / top) * (H - T - B); };
    el('line', {x1: L, y1: y(0), x2: W - R, y2: y(0), stroke: '#555'}, svg);
    for (let k = 0; k <= 4; k++) {
      const v = top * k / 4;
      el('line', {x1: L, y1: y(v), x2: W - R, y2: y(v), stroke: '#eee'}, svg);
      el('text', {x: L - 6, y: y(v) + 4, 'text-anchor': 'end', 'font-size': 11}, svg).textContent = v.toFixed(1);
    }
    el('text', {x: 14, y: T + (H - T - B) / 2, 'font-size': 11, transform: 'rotate(-90 14 ' + (T + (H - T - B) / 2) + ')',
                'text-anchor': 'middle'}, svg).textContent = 'latency (ms)';
    data.commits.forEach(function (c, i) {
      const label = el('text', {x: x(i), y: H - B + 16, 'font-size': 10, 'text-anchor': 'end',
                                transform: 'rotate(-40 ' + x(i) + ' ' + (H - B + 16) + ')'}, svg);
      label.textContent = c.commit.slice(0, 7);
      if (c.status !== 'ok') {
        el('rect', {x: x(i) - 8, y: T, width: 16, height: H - T - B, fill: '#eee'}, svg);
      }
    });
    const path = points.map(function (p, k) { return (k ? 'L' : 'M') + x(p.index) + ' ' + y(p.p50_ms); }).join(' ');
    el('path', {d: path, fill: 'none', stroke: '#1565c0', 'stroke-width': 1.5}, svg);
    points.forEach(function (p) {
      el('line', {x1: x(p.index), y1: y(p.p25_ms), x2: x(p.index), y2: y(p.p75_ms), stroke: '#1565c0'}, svg);
      const dot = el('circle', {cx: x(p.index), cy: y(p.p50_ms), r: p.verdict === 'slower' || p.verdict === 'faster' ? 6 : 4,
                                fill: colors[p.verdict] || '#1565c0'}, svg);
      let tip = p.commit + ' ' + p.subject + '\\nmedian ' + p.p50_ms.toFixed(2) + ' ms (25-75%: ' +
                p.p25_ms.toFixed(2) + '-' + p.p75_ms.toFixed(2) + '), ' + p.n + ' samples, ' + p.rounds + ' rounds';
      if (p.verdict && p.ratio != null) tip += '\\n' + p.verdict + ' than the previous commit: ' + p.ratio.toFixed(3) + ' [' +
                            p.ci_low.toFixed(3) + ', ' + p.ci_high.toFixed(3) + '] ' + p.method;
      el('title', {}, dot).textContent = tip;
    });
    holder.appendChild(section);
  });
  document.getElementById('status').textContent = 'charts: ' + data.configs.length;
})();
"""


def _cell(row: dict | None) -> str:
    if row is None:
        return "<td></td>"
    text = f"{row['p50_ms']:.2f} ms"
    if row.get("verdict") and "ratio" in row:
        text += (f" <span class=\"{html.escape(row['verdict'].replace(' ', '-'))}\">{MARKS[row['verdict']].strip()}"
                 f" {row['ratio']:.3f}</span> [{row['ci_low']:.3f}, {row['ci_high']:.3f}]")
    return f"<td class=\"num\">{text}</td>"


def table(rows: list[dict], commits: list[str], configs: list[str], links: dict[str, str]) -> str:
    """The last commits, newest first: each config's median and verdict, and the link to the records."""
    head = "".join(f"<th>{html.escape(c)}</th>" for c in configs)
    body = []
    for commit in reversed(commits[-LAST_COMMITS:]):
        mine = [r for r in rows if r["commit"] == commit[:10]]
        if not mine:
            continue
        first = mine[0]
        link = f"<a href=\"{html.escape(links[commit])}\">records</a>" if commit in links else ""
        if first["status"] != "ok":
            cells = f"<td class=\"failed\" colspan=\"{len(configs)}\">{html.escape(first['status'])}: " \
                    f"{html.escape(first.get('error', ''))}</td>"
        else:
            by_config = {r["config"]: r for r in mine}
            cells = "".join(_cell(by_config.get(c)) for c in configs)
        body.append(f"<tr><td><code>{commit[:10]}</code></td><td>{html.escape(first['subject'])}</td>{cells}"
                    f"<td>{link}</td></tr>")
    return (f"<table id=\"commits\"><thead><tr><th>commit</th><th>subject</th>{head}<th></th></tr></thead>"
            f"<tbody>{''.join(body)}</tbody></table>")


def inline_json(data) -> str:
    """`data` as JSON safe inside a <script> element: `<`, `>` and `&` as JSON escapes (\\u003c ...),
    which JSON.parse reads back as the same characters."""
    return (json.dumps(data).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026"))


def write(rows: list[dict], commits: list[str], records: Path, out: Path, title: str) -> Path:
    """Write out/index.html and copy each shown commit's records to out/records/; return the page's path."""
    (out / "records").mkdir(parents=True, exist_ok=True)
    links = {}
    for commit in commits:
        source = records / f"{commit}.jsonl"
        if source.exists():
            shutil.copyfile(source, out / "records" / source.name)
            links[commit] = f"records/{source.name}"
    configs = sorted({r["config"] for r in rows if "config" in r})
    index = {c[:10]: i for i, c in enumerate(commits)}
    points = [{**{k: r.get(k) for k in ("commit", "subject", "config", "n", "rounds", "p50_ms", "p25_ms", "p75_ms",
                                       "ratio", "ci_low", "ci_high", "method", "verdict")}, "index": index[r["commit"]]}
              for r in rows if "config" in r]
    data = {"configs": configs, "rows": points,
            "commits": [{"commit": c, "status": next((r["status"] for r in rows if r["commit"] == c[:10]), "missing")}
                        for c in commits]}
    # No "<", ">" or "&" in the inline JSON, whatever a commit subject holds: "</script" would end the
    # element early and "<!--<script" would make the HTML parser swallow the page's script with it.
    embedded = inline_json(data)
    legend = ("<p class=\"legend\"><span class=\"slower\">+ slower</span><span class=\"faster\">- faster</span>"
              "<span>~ not significant</span> than the previous measured commit (paired ratio of medians, "
              "its interval); bars: 25-75% of the samples; grey: the commit could not run the preset</p>")
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title><style>{STYLE}</style></head>
<body><h1>{html.escape(title)}</h1>
<p>Generated {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by <code>ddpbench history --html</code>;
{len(commits)} commits, {len(configs)} configs. <span id="status">charts need JavaScript</span></p>
{legend}<div id="charts"></div>
<h2>Last commits</h2>{table(rows, commits, configs, links)}
<script type="application/json" id="history-data">{embedded}</script>
<script>{SCRIPT}</script>
</body></html>
"""
    (out / "index.html").write_text(page)
    return out / "index.html"
