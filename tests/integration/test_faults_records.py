"""Records that survive any crash: torn lines, full disks, unreadable lines, a strict compare gate, and
history re-measures that replace a commit's records only when complete."""
import dataclasses
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from experiments.cli import build_parser, main, resolve_run_configs
from experiments.core.records import RecordWarning, append_record, read_records
from tests.unit.test_faults_records import record_warnings, run_record


ROOT = Path(__file__).resolve().parents[2]


TINY = ["--model", "resnet-tiny", "--image-size", "16", "--batch-size", "2", "--iters", "2", "--warmup", "0",
        "--world-size", "1"]


# Run in a fresh interpreter: `ddpbench run` with every write to the record file failing (ENOSPC after
# writing part of the line), as on a full disk; the records already there must stay as they were.
FULL_DISK = """
import errno, os, sys
real_write, out = os.write, os.path.realpath(sys.argv[1])
def write(fd, data):
    try:
        target = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        target = None
    if target != out:
        return real_write(fd, data)
    if len(data) > 8:
        return real_write(fd, bytes(data[:8]))
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
os.write = write
from experiments.cli import build_parser, main, resolve_run_configs
sys.exit(main(["run", *sys.argv[2:], "--out", sys.argv[1]]))
"""


@pytest.mark.timeout(240)
def test_a_sweep_that_cannot_write_its_record_says_so_in_one_line_and_exits_1(tmp_path):
    out = tmp_path / "r.jsonl"
    append_record(out, run_record(7.0))
    before = out.read_bytes()
    done = subprocess.run([sys.executable, "-c", FULL_DISK, str(out), *TINY], cwd=ROOT, capture_output=True,
                          text=True, timeout=200, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"ddpbench run: error: cannot write the record to {out}: No space left on device"]
    assert out.read_bytes() == before


@pytest.mark.timeout(240)
def test_resume_after_a_crash_skips_what_is_recorded_and_appends_a_readable_record(tmp_path, capsys):
    out = tmp_path / "r.jsonl"
    # What an earlier `run --bucket-mb 1` recorded (its config as the CLI resolves it; the numbers aside)
    earlier = resolve_run_configs(build_parser().parse_args(["run", *TINY, "--bucket-mb", "1", "--out", str(out)]))
    append_record(out, {**run_record(), "config": dataclasses.asdict(earlier[0])})
    with open(out, "ab") as f:
        f.write(b"<<garbage from an editor>>\n")  # an unreadable line, now in the middle
        f.write(b'{"schema_version": 2, "kind": "run", "status": "ok", "config": {"mo')  # torn by a crash
    capsys.readouterr()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(["run", *TINY, "--bucket-mb", "1,2", "--out", str(out), "--resume"]) == 0
    assert "1 ok, 0 failed, 1 skipped" in capsys.readouterr().out
    said = record_warnings(caught)
    assert f"{out}:2: skipping an unreadable line (not JSON)" in said
    assert any(m.startswith(f"{out} ended in a torn line") for m in said)
    with pytest.warns(RecordWarning, match=f"{out}:2: skipping an unreadable line"):
        got = read_records(out)
    assert [r["config"]["bucket_mb"] for r in got] == [1.0, 2.0] and all(r["status"] == "ok" for r in got)
    assert Path(f"{out}.torn").read_text().startswith('{"schema_version": 2, "kind": "run"')
