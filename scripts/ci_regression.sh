#!/usr/bin/env bash
# Per-commit latency gate for CI: A/B this commit against its base on this machine (both revisions'
# ddp_core in one set of processes, taking turns iteration by iteration; `ddpbench ab --help`), and fail (exit 1) when any config of the preset is significantly
# slower by more than the threshold. Exit 2: bad input, or a revision that cannot run the preset.
#
#   scripts/ci_regression.sh [BASE_REV]
#
# BASE_REV defaults to the merge base with origin/main, or HEAD~1 on main itself.
# DDPBENCH_AB_PRESET (smoke | link | paper-cpu | quick) chooses the work (default smoke);
# DDPBENCH_AB_INTERLEAVE=processes measures changes outside ddp_core too (fresh processes per round,
# noisier; DDPBENCH_AB_ROUNDS rounds); DDPBENCH_AB_THRESHOLD the relative slowdown that counts (ab's
# default: 0.03 interleaved, 0.05 processes).
# DDPBENCH_AB_KEEP: a new folder to keep the records in (e.g. for the CI job's artifacts).
set -euo pipefail
cd "$(dirname "$0")/.."
base="${1:-}"
if [ -z "$base" ]; then
  base=$(git merge-base HEAD origin/main 2>/dev/null || git rev-parse HEAD~1)
fi
if [ "$(git rev-parse "$base")" = "$(git rev-parse HEAD)" ]; then
  base=$(git rev-parse HEAD~1)
fi
exec ./ddpbench ab "$base" HEAD --preset "${DDPBENCH_AB_PRESET:-smoke}" --interleave "${DDPBENCH_AB_INTERLEAVE:-iterations}" \
  ${DDPBENCH_AB_ROUNDS:+--rounds "$DDPBENCH_AB_ROUNDS"} ${DDPBENCH_AB_THRESHOLD:+--threshold "$DDPBENCH_AB_THRESHOLD"} \
  ${DDPBENCH_AB_KEEP:+--keep "$DDPBENCH_AB_KEEP"}
