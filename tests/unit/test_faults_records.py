"""Records that survive any crash: torn lines, full disks, unreadable lines, a strict compare gate, and
history re-measures that replace a commit's records only when complete."""
import contextlib
import errno
import json
import os
import re
import subprocess
import warnings
from pathlib import Path

import pytest

from experiments.cli import main
from experiments.core import records
from experiments.core.records import (
    RecordError,
    RecordWarning,
    RecordWriteError,
    SchemaError,
    append_record,
    load_records,
    read_records,
    recorded_keys,
)
from experiments.regression import history
from experiments.regression.compare import pooled_samples

CONFIG = {"model": "resnet-tiny", "impl": "ddp_core", "backend": "gloo", "device": "cpu", "world_size": 2,
          "bucket_mb": 1.0, "sync_every": 1, "process_groups": 1, "comm_hook": "none"}


def run_record(bucket_mb: float = 1.0, latency=(0.1, 0.11, 0.09), **extra) -> dict:
    """A successful run record that compare can read."""
    return {"kind": "run", "status": "ok", "config": {**CONFIG, "bucket_mb": bucket_mb}, "latency_s": list(latency),
            **extra}


def record_warnings(caught) -> list[str]:
    """The messages of the RecordWarnings among `caught`."""
    return [str(w.message) for w in caught if issubclass(w.category, RecordWarning)]


# 1. An append never continues a torn line; a failed write leaves the file as it was.

def test_an_append_sets_a_torn_last_line_aside_instead_of_continuing_it(tmp_path):
    path = tmp_path / "r.jsonl"
    append_record(path, run_record(1.0))
    with open(path, "ab") as f:
        f.write(b'{"schema_version": 2, "kind": "run", "sta')  # a crash mid-write
    with pytest.warns(RecordWarning, match=rf"{path} ended in a torn line \(\d+ bytes.*moved it to {path}.torn"):
        append_record(path, run_record(2.0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every line is a whole record again: nothing to skip
        assert [r["config"]["bucket_mb"] for r in read_records(path)] == [1.0, 2.0]
    assert Path(f"{path}.torn").read_bytes() == b'{"schema_version": 2, "kind": "run", "sta\n'
    with open(path, "ab") as f:  # a second crash: its fragment is added to the same .torn file
        f.write(b'{"schema_ver')
    with pytest.warns(RecordWarning):
        append_record(path, run_record(3.0))
    assert Path(f"{path}.torn").read_text().splitlines() == ['{"schema_version": 2, "kind": "run", "sta',
                                                              '{"schema_ver']
    assert len(read_records(path)) == 3 and not list(tmp_path.glob("*.torn.jsonl"))
    # A last line that lost only its newline is a whole record: kept, and given its newline.
    whole = tmp_path / "whole.jsonl"
    whole.write_text(json.dumps({"schema_version": 2, **run_record(1.0)}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        append_record(whole, run_record(2.0))
        assert len(read_records(whole)) == 2
    assert not Path(f"{whole}.torn").exists()


def test_a_full_disk_raises_one_line_and_truncates_the_partial_write(tmp_path, monkeypatch):
    path = tmp_path / "r.jsonl"
    append_record(path, run_record(1.0))
    before = path.read_bytes()
    real_write, calls = os.write, []

    def disk_fills_up(fd, data):  # the first call writes half the line, the next finds the disk full
        calls.append(len(data))
        if len(calls) == 1:
            return real_write(fd, bytes(data[: len(data) // 2]))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(records.os, "write", disk_fills_up)
    with pytest.raises(RecordWriteError) as failure:
        append_record(path, run_record(2.0))
    monkeypatch.undo()
    assert str(failure.value) == f"cannot write the record to {path}: No space left on device"
    assert failure.value.errno == errno.ENOSPC and len(calls) == 2
    assert path.read_bytes() == before  # the half line is gone: the next append starts on a fresh line
    append_record(path, run_record(3.0))
    assert [r["config"]["bucket_mb"] for r in read_records(path)] == [1.0, 3.0]


# 1 and 2 through the CLI: a torn line and an unreadable line, then `run --resume`.


# 2. Lenient readers skip an unreadable line anywhere, naming file:line; an unknown version is refused.

def test_readers_skip_unreadable_lines_anywhere_with_a_warning_naming_file_and_line(tmp_path, monkeypatch):
    folder = tmp_path / "runs" / "m"
    folder.mkdir(parents=True)
    path = folder / "e3_bucket_size.jsonl"
    append_record(path, run_record(1.0))
    with open(path, "a") as f:
        f.write("not json at all\n[1, 2]\n")
    append_record(path, run_record(2.0))
    with pytest.warns(RecordWarning) as caught:
        assert [r["config"]["bucket_mb"] for r in read_records(path)] == [1.0, 2.0]
    assert record_warnings(caught) == [f"{path}:2: skipping an unreadable line (not JSON)",
                                       f"{path}:3: skipping an unreadable line (JSON but not an object)"]
    with pytest.warns(RecordWarning):
        assert len(recorded_keys(path)) == 2  # what --resume skips
    with pytest.warns(RecordWarning):
        assert list(load_records(path)["bucket_mb"]) == [1.0, 2.0]
    with pytest.warns(RecordWarning):
        assert len(pooled_samples(path, strict=False)) == 2  # history's table
    monkeypatch.setenv("DDPBENCH_RESULTS", str(tmp_path))
    monkeypatch.setenv("DDPBENCH_MACHINE", "m")
    from analysis.common import runs  # the report's loader

    with pytest.warns(RecordWarning):
        assert list(runs("e3_bucket_size")["bucket_mb"]) == [1.0, 2.0]
    # The strict reader refuses the same line; a record of an unknown version is refused by both.
    with pytest.raises(RecordError, match=rf"{path}:2: not a record \(not JSON\)"):
        read_records(path, strict=True)
    newer = tmp_path / "newer.jsonl"
    newer.write_text(json.dumps({"schema_version": 3, **run_record()}) + "\n")
    with pytest.raises(SchemaError, match="schema_version 3, but this ddpbench reads versions 1 and 2"):
        read_records(newer)


# 3. compare is a gate: bad input is refused with exit 2 and one line naming file:line.

def _bad_line(case: str) -> str:
    good = {"schema_version": 2, **run_record()}
    if case == "nan":
        return json.dumps({**good, "latency_s": [0.1, float("nan"), 0.1]})  # json.dumps writes NaN
    if case == "infinite":
        return json.dumps({**good, "latency_s": [0.1, float("inf")]})
    if case == "zero":
        return json.dumps({**good, "latency_s": [0.1, 0.0]})
    if case == "negative":
        return json.dumps({**good, "latency_s": [-0.1, 0.1]})
    if case == "text":
        return json.dumps({**good, "latency_s": [0.1, "fast"]})
    if case == "no config":
        return json.dumps({k: v for k, v in good.items() if k != "config"})
    if case == "no latency":
        return json.dumps({k: v for k, v in good.items() if k != "latency_s"})
    if case == "not an object":
        return "[1, 2, 3]"
    if case == "not json":
        return "{oops"
    raise AssertionError(case)


@pytest.mark.parametrize("case, needle", [
    ("nan", r"latency_s\[1\] is nan; a latency must be a finite number of seconds above 0"),
    ("infinite", r"latency_s\[1\] is inf; a latency must be"),
    ("zero", r"latency_s\[1\] is 0.0; a latency must be"),
    ("negative", r"latency_s\[0\] is -0.1; a latency must be"),
    ("text", r"latency_s\[1\] is 'fast', not a number"),
    ("no config", r"a successful run record without `config`"),
    ("no latency", r"a successful run record without `latency_s` samples"),
    ("not an object", r"not a record \(JSON but not an object\)"),
    ("not json", r"not a record \(not JSON\)"),
])
def test_compare_refuses_a_bad_record_with_exit_2_naming_file_and_line(tmp_path, capsys, case, needle):
    base, new = tmp_path / "base.jsonl", tmp_path / "new.jsonl"
    for bucket in (1.0, 2.0):
        append_record(base, run_record(bucket))
    append_record(new, run_record(1.0))
    with open(new, "a") as f:
        f.write(_bad_line(case) + "\n")  # line 2, followed by a good record: in the middle
    append_record(new, run_record(2.0))
    capsys.readouterr()
    assert main(["compare", str(base), str(new)]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"ddpbench compare: error: {new}:2: "), captured.err
    assert re.search(needle, lines[0]), lines[0]
    assert captured.out == ""


def test_compare_still_skips_a_torn_last_line_with_a_warning(tmp_path, capsys):
    base, new = tmp_path / "base.jsonl", tmp_path / "new.jsonl"
    append_record(base, run_record(1.0))
    append_record(new, run_record(1.0))
    with open(new, "a") as f:
        f.write('{"schema_version": 2, "kind": "run", "latency_s": [0.1, Na')
    with pytest.warns(RecordWarning, match=f"{new}:2: skipping a torn last line"):
        assert main(["compare", str(base), str(new)]) == 0


# 4. history writes a re-measure beside the old records and replaces them only when it is complete.

def test_an_interrupted_history_remeasure_leaves_the_earlier_records_untouched(tmp_path, monkeypatch):
    commit = "c" * 40
    folder = tmp_path / "history"
    folder.mkdir()
    old = folder / f"{commit}.jsonl"
    append_record(old, run_record(1.0, round={"session": "s0", "index": 0}))
    append_record(old, {"kind": "history", "status": "ok", "commit": commit, "preset": "smoke",
                        "args": ["--an-older-grid"], "rounds": 1, "session": "s0", "error": None})
    assert history.closing_record(old, "smoke") is None  # the preset changed since: measured again
    before = old.read_bytes()

    @contextlib.contextmanager
    def no_worktrees(repo, commits, parent):
        yield {name: tmp_path for name in commits}

    rounds_run = []

    def interrupted_round(tree, preset, out, tag, retries):
        rounds_run.append(out)
        append_record(out, run_record(1.0, round=tag))
        if tag["index"] == 1:
            raise KeyboardInterrupt  # Ctrl-C (or a crash) in the middle of the re-measure

    monkeypatch.setattr(history, "worktrees", no_worktrees)
    monkeypatch.setattr(history, "run_round", interrupted_round)
    with pytest.raises(KeyboardInterrupt):
        history.measure([commit], folder, "smoke", 3, tmp_path)
    assert len(rounds_run) == 2 and rounds_run[0] != old  # written beside the old file, not into it
    assert old.read_bytes() == before
    assert sorted(p.name for p in folder.iterdir()) == [old.name]  # no partial file left behind
    # A partial file left by a run killed outright (even one that looks complete) counts for nothing.
    partial = folder / f"{commit}.jsonl.partial"
    append_record(partial, {"kind": "history", "status": "ok", "commit": commit, "preset": "smoke",
                            "args": history.preset_args("smoke"), "rounds": 1, "session": "s1", "error": None})
    assert history.closing_record(old, "smoke") is None
    assert len(read_records(folder)) == 2  # the old file's two records only

    def good_round(tree, preset, out, tag, retries):
        append_record(out, run_record(2.0, round=tag))

    monkeypatch.setattr(history, "run_round", good_round)
    history.measure([commit], folder, "smoke", 2, tmp_path)
    got = read_records(old)
    assert [r["kind"] for r in got] == ["run", "run", "history"] and got[0]["config"]["bucket_mb"] == 2.0
    assert history.closing_record(old, "smoke")["status"] == "ok"
    assert sorted(p.name for p in folder.iterdir()) == [old.name]


def _tiny_repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "file.txt").write_text("x\n")
    for command in (["init", "-q"], ["add", "-A"], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"]):
        subprocess.run(["git", *command], cwd=repo, check=True)
    return repo


@pytest.mark.parametrize("failure", ["full disk", "bad record"])
def test_ab_that_cannot_write_or_read_its_records_exits_2_not_1(tmp_path, monkeypatch, capsys, failure):
    from experiments.regression import ab

    def broken_round(tree, preset, out, tag, retries=0):
        if failure == "full disk":
            raise OSError(errno.ENOSPC, "No space left on device")
        out.write_text(json.dumps({"schema_version": 2, "kind": "run", "status": "ok", "round": tag,
                                   "config": {"model": "m"}, "latency_s": [float("nan")]}) + "\n")
        return None

    monkeypatch.setattr(ab, "run_round", broken_round)
    status = main(["ab", "HEAD", "HEAD", "--interleave", "processes", "--rounds", "3", "--repo",
                   str(_tiny_repo(tmp_path))])
    assert status == 2  # 1 would tell a CI gate "slower"
    err = capsys.readouterr().err
    assert ("No space left on device" if failure == "full disk" else "base.jsonl:1") in err
