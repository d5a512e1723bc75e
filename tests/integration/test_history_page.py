"""The history page (`ddpbench history --html`) renders in a real browser: headless Chromium loads it,
its script runs without errors and draws a chart for every config, whatever markup commit subjects hold."""
import re

from experiments.regression import page
from tests.browser import installed_browser, render


def _rows() -> tuple[list[dict], list[str]]:
    """Three commits (the last could not run) and two configs; the second commit is slower on one."""
    commits = [f"{i}" * 40 for i in (1, 2, 3)]
    rows = []
    for i, commit in enumerate(commits[:2]):
        for config, ms in (("resnet-tiny ddp_core gloo ws2 b25 n1 pg1 none", 50.0),
                           ("bert-tiny ddp_core gloo ws2 b25 n1 pg1 none", 12.0)):
            # a subject that ends the script element ("</script>") or opens an HTML comment that would swallow
            # the page's own script ("<!--<script>") must stay data
            row = {"commit": commit[:10], "subject": f"commit {i} </script> & <b> <!--<script>", "status": "ok",
                   "config": config,
                   "n": 240, "rounds": 8, "p50_ms": ms * (1.2 if i else 1), "p25_ms": ms * 0.95, "p75_ms": ms * 1.3}
            if i:
                row.update(ratio=1.2, ci_low=1.1, ci_high=1.3, method="paired x8", verdict="slower")
            rows.append(row)
    rows.append({"commit": commits[2][:10], "subject": "broken", "status": "failed", "error": "exited with status 1"})
    return rows, commits


def test_history_page_renders_in_chromium_without_script_errors(tmp_path):
    installed_browser()  # skips here, before the page is built, where there is none
    rows, commits = _rows()
    records = tmp_path / "records"
    records.mkdir()
    (records / f"{commits[0]}.jsonl").write_text("{}\n")
    index = page.write(rows, commits, records, tmp_path / "site", "history <test>")
    text = index.read_text()
    data = text.split('<script type="application/json" id="history-data">', 1)[1].split("</script>", 1)[0]
    assert not set("<>&") & set(data), "markup characters in the inline JSON"
    assert "href=\"records/" + commits[0] + ".jsonl\"" in text and (tmp_path / "site" / "records").is_dir()
    assert not re.search(r"(src|href)=\"(https?:)?//", text)  # self-contained: nothing fetched
    done = render(index, tmp_path / "profile")
    assert done.returncode == 0, done.stderr[-2000:]
    console = [line for line in done.stderr.splitlines() if ":CONSOLE" in line]
    assert not console, console  # an uncaught exception or a console.error would show here
    dom = done.stdout
    assert "charts: 2" in dom
    for config in {r["config"] for r in rows if "config" in r}:
        # each config has its section with a heading and a chart, drawn by the script
        assert f'<section class="config" data-config="{config}"><h2>{config}</h2><svg' in dom
    assert "commit 0 &lt;/script&gt; &amp; &lt;b&gt; &lt;!--&lt;script&gt;" in dom  # the subject as text, not markup
    assert dom.count("<svg") == 2 and dom.count("<circle") == 4
