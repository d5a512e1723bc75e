"""`ddpbench report RECORDS...` on a user's own sweep: what varies, a summary with ratios and intervals,
a figure per varied parameter, findings in one line each, and one self-contained page that a real
browser renders."""
import csv
import random
import re
from dataclasses import asdict, replace
from html.parser import HTMLParser

import pytest

from experiments.cli import main
from experiments.core.config import RunConfig
from experiments.core.records import append_record


def _sweep(path):
    """A 2 x 2 grid (bucket cap x implementation); 5 MB buckets are 10% faster, no overlap 30% slower."""
    rng = random.Random(0)
    for bucket_mb in (5.0, 25.0):
        for impl in ("ddp_core", "ddp_core_no_overlap"):
            config = replace(RunConfig(), bucket_mb=bucket_mb, impl=impl)
            base = 0.100 * (0.9 if bucket_mb == 5 else 1.0) * (1.3 if impl != "ddp_core" else 1.0)
            samples = [base * rng.uniform(0.98, 1.02) for _ in range(40)]
            append_record(path, {"kind": "run", "status": "ok", "config": asdict(config), "latency_s": samples,
                                 "summary": {"throughput": 16 / base}})


def test_report_of_a_sweep_finds_what_varies_and_says_what_is_fastest(tmp_path, capsys):
    records = tmp_path / "mine.jsonl"
    _sweep(records)
    assert main(["report", str(records)]) == 0
    out = capsys.readouterr().out
    # the baseline holds the defaults (25 MB, ddp_core); 5 MB takes 0.9x its time: 1.11x its samples/s
    line = next(line for line in out.splitlines() if line.startswith("bucket_mb 5 has the highest throughput"))
    ratio, low, high = map(float, re.search(r": ([\d.]+)x \[([\d.]+), ([\d.]+)\] the samples/s of bucket_mb 25\.$",
                                            line).groups())
    assert ratio == pytest.approx(1 / 0.9, abs=0.02) and 1 < low < ratio < high
    assert "impl ddp_core, the baseline's, has the highest throughput (with bucket_mb=25)." in out
    assert "Holm's correction" in out
    folder = tmp_path / "mine-report"
    rows = list(csv.DictReader((folder / "summary.csv").open()))
    assert len(rows) == 4 and sum(r["baseline"] == "True" for r in rows) == 1
    assert {(r["bucket_mb"], r["impl"]) for r in rows} == {(b, i) for b in ("5.0", "25.0")
                                                         for i in ("ddp_core", "ddp_core_no_overlap")}
    assert (folder / "latency-bucket_mb.png").stat().st_size > 5000 and (folder / "latency-impl.png").exists()
    assert "## Findings" in (folder / "report.md").read_text()


def test_report_bad_input_exits_2(tmp_path, capsys):
    assert main(["report", str(tmp_path / "none.jsonl")]) == 2
    assert "none.jsonl not found" in capsys.readouterr().err
    failed = tmp_path / "failed.jsonl"
    append_record(failed, {"kind": "run", "status": "failed", "config": asdict(RunConfig()), "error": "x"})
    assert main(["report", str(failed)]) == 2
    assert "no successful run records" in capsys.readouterr().err
    assert main(["report", "--html"]) == 2  # the main job's report has no page


class _Page(HTMLParser):
    """A page's tables (header rows and body rows, each a list of its cells' text), the text of its <code>
    elements, every tag opened, and all of its text."""

    def __init__(self):
        super().__init__()
        self.tables, self.code, self.tags, self.text = [], [], [], []
        self._part = self._row = self._cell = self._code = None

    @classmethod
    def of(cls, page: str) -> "_Page":
        parsed = cls()
        parsed.feed(page)
        parsed.close()
        return parsed

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        if tag == "table":
            self.tables.append({"head": [], "body": [], "loose": []})
            self._part = "loose"
        elif tag in ("thead", "tbody"):
            self._part = tag[1:]
        elif tag == "tr":
            self._row = []
            self.tables[-1][self._part].append(self._row)
        elif tag in ("th", "td"):
            self._cell = []
        elif tag == "code":
            self._code = []

    def handle_endtag(self, tag):
        if tag in ("th", "td"):
            self._row.append("".join(self._cell))
            self._cell = None
        elif tag == "code":
            self.code.append("".join(self._code))
            self._code = None

    def handle_data(self, data):
        self.text.append(data)
        for part in (self._cell, self._code):
            if part is not None:
                part.append(data)


def test_report_page_is_markdown_rendered_one_table_with_its_header(tmp_path):
    """The page renders the report's Markdown: headings, a list of findings, the table with its header
    row in <thead> and the configs in <tbody> of the same table, code spans as <code>."""
    records = tmp_path / "mine.jsonl"
    _sweep(records)
    assert main(["report", str(records), "--out", str(tmp_path / "site"), "--html"]) == 0
    text = (tmp_path / "site" / "index.html").read_text()
    page = _Page.of(text)
    assert len(page.tables) == 1, f"{len(page.tables)} tables"
    (table,) = page.tables
    assert not table["loose"] and len(table["head"]) == 1 and table["head"][0][:2] == ["bucket_mb", "impl"]
    assert len(table["body"]) == 4 and all(len(row) == len(table["head"][0]) for row in table["body"])
    assert {(row[0], row[1]) for row in table["body"]} == {(b, i) for b in ("5", "25")
                                                          for i in ("ddp_core", "ddp_core_no_overlap")}
    assert page.tags.count("th") == 11 and page.tags.count("h2") == 3 and page.tags.count("li") >= 3
    assert str(records) in page.code  # the records' path, a code span in the Markdown
    shown = "".join(page.text)
    assert "|---" not in shown and "`" not in shown and "|" not in shown


def _untrusted_sweep(path, models):
    """One config per model spec, each a little slower than the one before."""
    rng = random.Random(2)
    for i, model in enumerate(models):
        config = replace(RunConfig(), model=model)
        samples = [0.1 * (1 + 0.1 * i) * rng.uniform(0.98, 1.02) for _ in range(20)]
        append_record(path, {"kind": "run", "status": "ok", "config": asdict(config), "latency_s": samples})


UNTRUSTED = ["<script>alert(1)</script>", "file:a|b.py", "x `y` *z* _w_ [l](http://e.x) &amp; <b>"]


def test_config_strings_in_the_page_are_text_not_markup(tmp_path):
    """Model specs holding HTML, a `|`, backticks, `*`, `_`, a link and an entity are shown as they are: no
    element of theirs, no cell split, no code, emphasis or link."""
    records = tmp_path / "mine.jsonl"
    _untrusted_sweep(records, ["resnet-tiny", *UNTRUSTED])
    assert main(["report", str(records), "--out", str(tmp_path / "site"), "--html"]) == 0
    text = (tmp_path / "site" / "index.html").read_text()
    assert "<script" not in text and "<b>" not in text and "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    page = _Page.of(text)
    assert not {"script", "b", "em", "strong", "a"} & set(page.tags)
    (table,) = page.tables
    assert table["head"][0][0] == "model"
    assert [row[0] for row in table["body"]] == ["resnet-tiny", *UNTRUSTED]
    assert all(len(row) == len(table["head"][0]) for row in table["body"])
    # the records' path and the command a finding names are code; a model spec's backticks make none
    assert page.code == [str(records), "ddpbench drift"]
    findings = [line for line in "".join(page.text).splitlines() if "has the lowest throughput" in line]
    assert findings and findings[0].startswith(f"model {UNTRUSTED[-1]} has the lowest throughput")
