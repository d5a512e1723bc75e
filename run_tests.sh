#!/usr/bin/env bash
# The test suite: installs the pinned environment on first use (see scripts/env.sh), then runs pytest.
# Extra arguments go to pytest, e.g. ./run_tests.sh -k bucketing, or ./run_tests.sh -m gpu on a GPU.
set -euo pipefail
cd "$(dirname "$0")"
source scripts/env.sh
exec python -m pytest "$@"
