"""Whose numbers are these? A machine is named once from its fingerprint, its records are filed and read
under that name only, the project's reference results are never taken for this machine's, and a report
over records of several machines says so."""
import json
import os
import subprocess
from pathlib import Path

import pytest

from experiments.cli import main
from experiments.core import machine as machines
from experiments.core.config import ConfigError
from experiments.core.profile import find_profile

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def machine_file(tmp_path, monkeypatch):
    """A machine file of this test's own, and no cached identity."""
    path = tmp_path / "machine.json"
    monkeypatch.setenv("DDPBENCH_MACHINE_FILE", str(path))
    machines.this_machine.cache_clear()
    yield path
    machines.this_machine.cache_clear()


def test_a_machine_is_named_once_from_its_fingerprint_and_can_be_renamed(machine_file):
    first = machines.this_machine()
    assert first["name"].startswith(f"{first['fingerprint']['arch']}-{os.cpu_count()}cpu-")
    assert first["name"].endswith(first["id"][:6])  # two machines of one kind get different names
    stored = json.loads(machine_file.read_text())["machines"]
    assert stored[first["id"]]["name"] == first["name"]
    machines.this_machine.cache_clear()
    assert machines.this_machine()["name"] == first["name"]  # read back, not made anew
    assert main(["machine", "--machine", "lab-a"]) == 0
    assert machines.machine_name() == "lab-a"
    assert json.loads(machine_file.read_text())["machines"][first["id"]]["name"] == "lab-a"


def test_another_host_is_another_machine(machine_file, monkeypatch):
    here = machines.this_machine()
    machines.this_machine.cache_clear()
    monkeypatch.setattr(machines, "host_id", lambda: "another-host")
    there = machines.this_machine()
    assert there["id"] != here["id"] and there["name"] != here["name"]
    assert set(json.loads(machine_file.read_text())["machines"]) == {here["id"], there["id"]}


@pytest.mark.parametrize("name, message", [("bad name", "is not allowed"), ("-x", "is not allowed"),
                                           ("reference", "is not allowed"), ("", "is not allowed")])
def test_a_bad_machine_name_is_refused(machine_file, name, message, capsys):
    assert main(["machine", f"--machine={name}"]) == 2
    assert message in capsys.readouterr().err


def test_a_name_another_machine_has_is_refused(machine_file, monkeypatch):
    machines.rename_machine("box")
    machines.this_machine.cache_clear()
    monkeypatch.setattr(machines, "host_id", lambda: "another-host")
    with pytest.raises(ConfigError, match="already names another machine"):
        machines.rename_machine("box")


def test_records_carry_the_machine_that_made_them(machine_file):
    env = machines.environment(threads=1)
    assert env["machine"] == machines.machine_name() and env["machine_id"] == machines.this_machine()["id"]


def _profile(machine_id: str, forward: float) -> dict:
    config = {"model": "m", "device": "cpu", "batch_size": 2, "image_size": 8, "seq_len": 2, "threads": 1,
              "model_config": "", "amp": "none", "model_hash": "", "world_size": 1}
    row = {"forward": forward, "backward": 0.1, "tail": 0.0, "optimizer": 0.01, "ready": [0.1]}
    return {"kind": "profile", "status": "ok", "config": config, "synced": [row],
            "skipped": [{"forward": forward, "backward": 0.1}], "bytes": [4], "dtypes": ["torch.float32"],
            "buffer_bytes": 0, "env": {"machine_id": machine_id, "time": "2026-01-01T00:00:00Z"}}


def test_a_profile_of_another_machine_is_not_used_for_this_ones_runs():
    records = [_profile("mine", 1.0), _profile("theirs", 2.0)]
    config = records[0]["config"]
    assert find_profile(records, config, machine_id="mine").forward == 1.0
    assert find_profile(records, config, machine_id="theirs").forward == 2.0
    assert find_profile(records, config, machine_id="nobody") is None
    assert find_profile(records, config).forward == 2.0  # no machine asked: the newest, as before


def test_version_names_the_commit_of_the_code(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    assert out.startswith("ddpbench 0.1.0 (commit ") and commit in out
