#!/usr/bin/env bash
# The test suite: installs the pinned environment on first use (see scripts/env.sh), then runs pytest.
# Extra arguments go to pytest, e.g. ./run_tests.sh -k bucketing, or ./run_tests.sh -m gpu on a GPU.
set -euo pipefail
cd "$(dirname "$0")"
source scripts/env.sh
# The history page test opens the page in headless Chromium: install it where missing (quietly; the
# test skips, saying why, if it is still missing).
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium; } \
    >/dev/null 2>&1 || echo "run_tests.sh: could not install chromium; the history page test will be skipped" >&2
fi
exec python -m pytest "$@"
