"""`ddpbench report RECORDS...` on a user's own sweep: what varies, a summary with ratios and intervals,
a figure per varied parameter, findings in one line each, and one self-contained page that a real
browser renders."""
import random
import re
from dataclasses import asdict, replace

import pytest

from experiments.cli import main
from experiments.core.config import RunConfig
from experiments.core.records import append_record
from tests.browser import installed_browser, render
from tests.unit.test_sweep_report import UNTRUSTED, _Page, _sweep, _untrusted_sweep


def _world_size_sweep(path, noisy_bucket: bool = False):
    """torch and ddp_core at 1 and 2 ranks (threads follow: 2 and 1), as a user's sweep on 2 cores: 2 ranks train
    1.76x the samples/s of 1 though each iteration takes 14% longer; ddp_core at 1 rank is the slowest of all."""
    rng = random.Random(1)
    latency = {("torch", 1): 0.0626, ("torch", 2): 0.0712, ("ddp_core", 1): 0.0955, ("ddp_core", 2): 0.0720}
    for (impl, ranks), seconds in latency.items():
        config = replace(RunConfig(), impl=impl, world_size=ranks, threads=2 // ranks, batch_size=16)
        samples = [seconds * rng.uniform(0.97, 1.03) for _ in range(30)]
        append_record(path, {"kind": "run", "status": "ok", "config": asdict(config), "latency_s": samples})
    if noisy_bucket:  # 1 MB buckets: 3% faster by the median, but noisy by +-30%
        config = replace(RunConfig(), impl="torch", world_size=2, threads=1, batch_size=16, bucket_mb=1.0)
        append_record(path, {"kind": "run", "status": "ok", "config": asdict(config),
                             "latency_s": [0.069 * rng.uniform(0.7, 1.3) for _ in range(10)]})


def test_world_size_findings_speak_of_throughput_and_mark_what_is_not_significant(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("DDPBENCH_RESULTS", str(tmp_path / "results"))  # no stored drift
    records = tmp_path / "ws.jsonl"
    _world_size_sweep(records, noisy_bucket=True)
    assert main(["report", str(records)]) == 0
    lines = capsys.readouterr().out.splitlines()
    # not "world_size 1 is the fastest": per iteration it is, but 2 ranks train 1.76x the samples per second
    ws = next(line for line in lines if line.startswith("world_size 1 has the lowest throughput"))
    ratio = float(re.search(r": ([\d.]+)x \[", ws).group(1))
    assert ratio == pytest.approx(0.0712 / 0.0626 / 2, abs=0.02)  # samples/s: 16 / 62.6 ms against 32 / 71.2 ms
    efficiency = float(re.search(r"per-rank efficiency of 2 ranks over 1: ([\d.]+) \[", ws).group(1))
    assert efficiency == pytest.approx(0.0626 / 0.0712, abs=0.02)
    assert not any(line.startswith("threads") for line in lines)  # threads follow from the world size
    assert any("threads (follows from world_size)" in line for line in lines)
    # the largest effect in the table (ddp_core at 1 rank) is never left out
    assert any(re.match(r"The largest difference in the table: world_size=1, .*impl=ddp_core: 0.3", line) for line in lines)
    bucket = next(line for line in lines if line.startswith("bucket_mb 1 has the highest throughput"))
    assert bucket.endswith("- not significant."), bucket
    assert any("Holm's correction over these" in line for line in lines)


def test_report_page_is_self_contained_and_renders_in_chromium(tmp_path):
    installed_browser()  # skips here, before the page is built, where there is none
    records = tmp_path / "mine.jsonl"
    _sweep(records)
    assert main(["report", str(records), "--out", str(tmp_path / "site"), "--html"]) == 0
    index = tmp_path / "site" / "index.html"
    text = index.read_text()
    assert not re.search(r"(src|href)=\"(https?:)?//", text)  # nothing fetched: figures are inlined
    done = render(index, tmp_path / "profile")
    assert done.returncode == 0, done.stderr[-2000:]
    dom = done.stdout
    assert dom.count('src="data:image/png;base64,') == 2 and dom.count("<tr>") == 5
    assert "bucket_mb 5 has the highest throughput" in dom
    # as the browser built it: the header row and the four configs in one table, no Markdown left as text
    (table,) = _Page.of(dom).tables
    assert table["head"] == [["bucket_mb", "impl", "median_ms", "q25_ms", "q75_ms", "samples_per_s",
                              "peak_mb_per_rank", "ratio_to_baseline", "ci_low", "ci_high", "baseline"]]
    assert len(table["body"]) == 4 and all(len(row) == 11 for row in table["body"])
    assert "|---" not in dom and "`" not in dom


def test_report_page_with_untrusted_config_strings_renders_in_chromium(tmp_path):
    installed_browser()  # skips here, before the page is built, where there is none
    records = tmp_path / "mine.jsonl"
    _untrusted_sweep(records, ["resnet-tiny", *UNTRUSTED])
    assert main(["report", str(records), "--out", str(tmp_path / "site"), "--html"]) == 0
    index = tmp_path / "site" / "index.html"
    done = render(index, tmp_path / "profile")
    assert done.returncode == 0, done.stderr[-2000:]
    console = [line for line in done.stderr.splitlines() if ":CONSOLE" in line]
    assert not console, console  # the page has no script; an injected one would run and could log here
    page = _Page.of(done.stdout)
    assert "script" not in page.tags and "b" not in page.tags
    (table,) = page.tables
    assert [row[0] for row in table["body"]] == ["resnet-tiny", *UNTRUSTED]
    assert all(len(row) == len(table["head"][0]) for row in table["body"])
