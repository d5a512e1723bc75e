"""scripts/env.sh's first install: pip's own progress on a terminal, one line and a log elsewhere.

Runs a copy of env.sh beside an empty requirements.txt into a temporary DDPBENCH_VENV_ROOT (a venv
with pip alone, offline: seconds), once with stderr a file and once on a pseudo-terminal (`script`)."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _install(tmp_path: Path, on_terminal: bool) -> tuple[int, str, Path]:
    """Source a copy of env.sh in a clean tree; its exit status, what it printed and the venv root."""
    tree = tmp_path / "tree"
    (tree / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "env.sh", tree / "scripts" / "env.sh")
    (tree / "requirements.txt").write_text("# nothing to install\n")
    venvs = tmp_path / "venvs"
    env = {**os.environ, "DDPBENCH_VENV_ROOT": str(venvs), "PYTHON": sys.executable, "PIP_NO_INDEX": "1"}
    shell = "set -euo pipefail; source scripts/env.sh; echo active: $VIRTUAL_ENV"
    if on_terminal:  # stdout and stderr on one pseudo-terminal: what a user sees
        argv = ["script", "-qec", f"bash -c '{shell}'", "/dev/null"]
        done = subprocess.run(argv, cwd=tree, env=env, capture_output=True, text=True, timeout=300)
        return done.returncode, done.stdout, venvs
    done = subprocess.run(["bash", "-c", shell], cwd=tree, env=env, capture_output=True, text=True, timeout=300)
    return done.returncode, done.stderr, venvs


@pytest.mark.parametrize("on_terminal", [False, True], ids=["not-a-terminal", "terminal"])
def test_the_first_install_shows_pip_on_a_terminal_only(tmp_path, on_terminal):
    if on_terminal and shutil.which("script") is None:
        pytest.skip("needs util-linux's `script` for a pseudo-terminal")
    status, shown, venvs = _install(tmp_path, on_terminal)
    assert status == 0, shown
    lines = [line for line in shown.replace("\r", "").splitlines() if not line.startswith("active: ")]
    assert lines[0].startswith("ddpbench: installing the pinned environment into "), shown
    pip_lines = [line for line in lines[1:] if "Requirement already satisfied: pip" in line]
    assert bool(pip_lines) == on_terminal, shown  # pip's own lines: on a terminal only
    if not on_terminal:
        assert lines == lines[:1], shown  # quiet: the one line
    (log,) = venvs.glob("venv-*.install.log")  # and pip's output in the log either way
    assert "Requirement already satisfied: pip" in log.read_text()
    assert len(list(venvs.glob("venv-*/.complete"))) == 1
