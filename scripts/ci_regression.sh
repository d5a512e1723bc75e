#!/usr/bin/env bash
# Per-commit latency gate for CI: A/B this commit against its base on this machine, interleaved,
# and fail (exit 1) when any config of the preset is significantly slower by more than the threshold.
#
#   scripts/ci_regression.sh [BASE_REV]
#
# BASE_REV defaults to the merge base with origin/main, or HEAD~1 on main itself.
# DDPBENCH_AB_PRESET (smoke | paper-cpu) and DDPBENCH_AB_ROUNDS choose the work; smoke is the default.
set -euo pipefail
cd "$(dirname "$0")/.."
base="${1:-}"
if [ -z "$base" ]; then
  base=$(git merge-base HEAD origin/main 2>/dev/null || git rev-parse HEAD~1)
fi
if [ "$(git rev-parse "$base")" = "$(git rev-parse HEAD)" ]; then
  base=$(git rev-parse HEAD~1)
fi
exec ./ddpbench ab "$base" HEAD --preset "${DDPBENCH_AB_PRESET:-smoke}" --rounds "${DDPBENCH_AB_ROUNDS:-4}"
