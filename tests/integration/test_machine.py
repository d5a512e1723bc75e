"""Whose numbers are these? A machine is named once from its fingerprint, its records are filed and read
under that name only, the project's reference results are never taken for this machine's, and a report
over records of several machines says so."""
import json
import os
import subprocess
import sys

import pytest

from experiments.core import machine as machines
from tests.unit.test_machine import ROOT
from tests.unit.test_machine import machine_file  # noqa: F401,F811  (fixtures: pytest finds them by name)


REFERENCE = ROOT / "results" / "reference" / "x86_64-2cpu"


def test_the_reference_results_are_never_this_machines(machine_file):
    # The reference folder's name has no fingerprint suffix: no machine of this suite is ever called so.
    assert (REFERENCE / "runs" / "x86_64-2cpu" / "e3_bucket_size.jsonl").exists()
    assert machines.machine_name() not in {p.name for p in (ROOT / "results" / "reference").iterdir()}
    env = {**os.environ, "DDPBENCH_MACHINE_FILE": str(machine_file)}
    env.pop("DDPBENCH_MACHINE", None)
    env.pop("DDPBENCH_RESULTS", None)  # (conftest points it at the tests' own folder) the default folder
    done = subprocess.run([sys.executable, "-c", "from analysis.common import machine, runs_folder; "
                           "print(machine()); print(runs_folder())"], cwd=ROOT, env=env, capture_output=True,
                          text=True, check=True)
    name, folder = done.stdout.split()
    assert name == machines.machine_name() and folder == str(ROOT / "results" / "runs" / name)


@pytest.mark.timeout(300)
def test_the_report_names_its_machine_and_warns_when_records_come_from_several(tmp_path):
    runs = tmp_path / "runs" / "box"
    runs.mkdir(parents=True)
    lines = (REFERENCE / "runs" / "x86_64-2cpu" / "e2_overlap.jsonl").read_text().splitlines()
    other = json.loads(lines[0])
    other["env"] = {**other["env"], "machine": "other-box", "machine_id": "0123456789"}
    (runs / "e2_overlap.jsonl").write_text("\n".join([*lines, json.dumps(other)]) + "\n")
    env = {**os.environ, "DDPBENCH_RESULTS": str(tmp_path), "DDPBENCH_MACHINE": "box"}
    subprocess.run([sys.executable, "-m", "analysis.report"], cwd=ROOT, env=env, capture_output=True, check=True)
    report = (tmp_path / "report.md").read_text()
    assert report.startswith("# ddpbench report: box") and "The machine `box`" in report
    assert "Warning: these records come from 2 machines" in report and "other-box (id 0123456789)" in report
    (runs / "e2_overlap.jsonl").write_text("\n".join(lines) + "\n")
    subprocess.run([sys.executable, "-m", "analysis.report"], cwd=ROOT, env=env, capture_output=True, check=True)
    assert "Warning: these records come from" not in (tmp_path / "report.md").read_text()
