"""Every analysis script's command line (analysis.common.script_main): --records and --out, and one line
with exit 2 where its records are missing (issue 39, item 12). In-process: one import per script, no
Python started per script; the redraw from the reference records only for three scripts."""
from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "results" / "reference" / "x86_64-2cpu"
# Every script runnable as `python analysis/X.py`: a new one is covered without being listed here.
SCRIPTS = sorted(p.stem for p in (ROOT / "analysis").glob("*.py") if 'if __name__ == "__main__":' in p.read_text())


def _run(name: str, argv: list[str], capsys) -> tuple[int, str, str]:
    """main(argv) of analysis/<name>.py in this process: its exit status, stdout and stderr."""
    status = importlib.import_module(f"analysis.{name}").main(argv)
    out, err = capsys.readouterr()
    return status, out, err


def _one_line_naming(err: str, path: Path) -> None:
    assert "Traceback" not in err
    assert err.endswith("\n") and err.count("\n") == 1, err
    shown = str(path.relative_to(ROOT)) if ROOT in path.parents else str(path)  # as the reader types it
    assert f"no records at {shown}" in err and "make them with" in err, err


def test_the_scripts_are_found_and_share_one_parser():
    assert {"e1_allreduce", "report", "advise_validation", "compile_overlap", "scale_model"} <= set(SCRIPTS)
    for name in SCRIPTS:
        text = (ROOT / "analysis" / f"{name}.py").read_text()
        assert "script_main(" in text and "argparse" not in text, name  # no script keeps a parser of its own
        assert text.rstrip().endswith("sys.exit(main())"), name


@pytest.mark.parametrize("name", SCRIPTS)
@pytest.mark.parametrize("records", ["missing", "empty folder", "empty file"])
def test_without_records_a_script_says_what_to_run_in_one_line_and_exits_2(name, records, tmp_path, capsys):
    path = tmp_path / "records"
    if records == "empty folder":
        path.mkdir()
    elif records == "empty file":
        path = tmp_path / f"{name}.jsonl"  # named after the experiment: still nothing in it
        path.write_text("\n")
    status, _, err = _run(name, ["--records", str(path), "--out", str(tmp_path / "out")], capsys)
    assert status == 2
    _one_line_naming(err, path)
    assert not (tmp_path / "out").exists()  # nothing drawn


@pytest.mark.parametrize("name", SCRIPTS)
def test_by_default_a_script_looks_where_it_always_did(name, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DDPBENCH_RESULTS", str(tmp_path))  # a machine without records
    monkeypatch.setenv("DDPBENCH_MACHINE", "box")
    status, _, err = _run(name, [], capsys)
    assert status == 2
    looked_at = {"advise_validation": tmp_path / "advise", "compile_overlap": tmp_path / "compile" / "records.jsonl"}
    _one_line_naming(err, looked_at.get(name, tmp_path / "runs" / "box"))
    # where the project has a copy, the line says how to draw it
    assert "--records results/reference/x86_64-2cpu/" in err
    assert not any(tmp_path.iterdir())


def test_a_script_run_on_its_own_without_records_ends_in_one_line(tmp_path):
    # The command, as a user types it (the one script started as its own Python here).
    env = {**os.environ, "DDPBENCH_RESULTS": str(tmp_path), "DDPBENCH_MACHINE": "box"}
    done = subprocess.run([sys.executable, "analysis/advise_validation.py"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    _one_line_naming(done.stderr, tmp_path / "advise")


def test_ddpbench_report_without_records_says_what_to_run(tmp_path, monkeypatch, capsys):
    from experiments.cli import main

    monkeypatch.setenv("DDPBENCH_RESULTS", str(tmp_path))
    monkeypatch.setenv("DDPBENCH_MACHINE", "box")
    assert main(["report"]) == 2
    _one_line_naming(capsys.readouterr().err, tmp_path / "runs" / "box")


def _files(folder: Path) -> dict[Path, int]:
    return {p: p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()}


@pytest.mark.parametrize("name, records, table, same_as_committed", [
    ("e3_bucket_size", REFERENCE / "runs" / "x86_64-2cpu", "e3_bucket_size", True),
    ("compile_overlap", REFERENCE / "compile", "compile_overlap", True),
    # (the committed advise table predates a change of the model: its predictions differ slightly)
    ("advise_validation", REFERENCE / "advise", "advise_validation", False),
])
def test_the_reference_machines_figures_are_redrawn_into_out(name, records, table, same_as_committed, tmp_path,
                                                             monkeypatch, capsys):
    monkeypatch.setenv("DDPBENCH_RESULTS", str(tmp_path / "results"))  # the default --out: must stay unused
    before = _files(REFERENCE)
    status, _, err = _run(name, ["--records", str(records), "--out", str(tmp_path / "out")],
                          capsys)
    assert status == 0, err
    written = (tmp_path / "out" / "tables" / f"{table}.csv").read_text()
    assert written.count("\n") > 1
    if same_as_committed:
        assert written == (REFERENCE / "tables" / f"{table}.csv").read_text()
    if name == "e3_bucket_size":
        assert (tmp_path / "out" / "figures" / "e3_bucket_size.png").stat().st_size > 0
    assert _files(REFERENCE) == before and not (tmp_path / "results").exists()


def test_a_records_file_is_read_as_the_experiment_it_is_named_after(tmp_path, capsys):
    e3 = REFERENCE / "runs" / "x86_64-2cpu" / "e3_bucket_size.jsonl"
    status, _, err = _run("e2_overlap", ["--records", str(e3), "--out", str(tmp_path)], capsys)
    assert status == 2
    _one_line_naming(err, e3)
    assert "named after: e2_overlap.jsonl" in err
