#!/usr/bin/env bash
# Sourced by run_all.sh and run_tests.sh (which run under `set -euo pipefail`): make sure the pinned
# Python environment exists, then activate it.
#
# The environment (torch alone is ~6 GB) lives outside the clone, keyed by a hash of requirements.txt,
# so that a second clone or a re-run reuses it and starts in seconds; a change of pins builds a new one.
# Override the location with DDPBENCH_VENV_ROOT.

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python_bin="${PYTHON:-python3}"
req_hash="$(sha256sum "$repo_root/requirements.txt" | cut -c1-12)"
venv_root="${DDPBENCH_VENV_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/ddpbench}"
venv="$venv_root/venv-$req_hash"

if [ ! -f "$venv/.complete" ]; then
  mkdir -p "$venv_root"
  # One installer at a time: a second job started meanwhile waits, then finds the install done.
  exec 9>"$venv.lock"
  flock 9
  if [ ! -f "$venv/.complete" ]; then
    log="$venv.install.log"
    echo "ddpbench: installing the pinned environment into $venv (first run only; a few minutes)" >&2
    rm -rf "$venv" "$log"
    # The install's steps; extra arguments go to both pip commands.
    _ddpbench_install() {
      "$python_bin" -m venv "$venv" &&
        "$venv/bin/python" -m pip install --disable-pip-version-check "$@" --upgrade pip &&
        "$venv/bin/python" -m pip install --disable-pip-version-check "$@" -r "$repo_root/requirements.txt"
    }
    if [ -t 2 ]; then
      # On a terminal pip shows its own progress (a line per package, bars for the ~6 GB of downloads and
      # installs), on stderr so that a command's output stays its own; pip's detailed log goes to $log.
      if ! _ddpbench_install --log "$log" >&2; then
        echo "ddpbench: installing the environment failed (above); pip's detailed log is in $log" >&2
        exit 1
      fi
    elif ! _ddpbench_install >"$log" 2>&1; then
      # Not a terminal (CI, tests, a job's log): quiet, and the end of the log where it fails.
      tail -n 30 "$log" >&2
      echo "ddpbench: installing the environment failed; the whole log is in $log" >&2
      exit 1
    fi
    unset -f _ddpbench_install
    # Marks a finished install: an interrupted one is redone instead of half-used.
    touch "$venv/.complete"
  fi
  flock -u 9
  exec 9>&-
fi

# shellcheck disable=SC1091
source "$venv/bin/activate"
# The venv may be shared by several clones, so the project itself is put on the path, not installed.
export PYTHONPATH="$repo_root${PYTHONPATH:+:$PYTHONPATH}"
