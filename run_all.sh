#!/usr/bin/env bash
# The main job: measure the paper's experiments E1-E8 on this hardware, then build the report.
#
#   ./run_all.sh [--profile smoke|quick|full] [--only e1_allreduce,e3_bucket_size,...] [--rerun]
#
# The profile defaults to the hardware: full with GPUs (NCCL and Gloo, real input sizes), quick on CPUs
# (Gloo, world sizes 1 and 2, reduced input sizes; about 30 minutes on 2 cores). smoke uses tiny models
# and writes to results/smoke/ instead of results/. Finished configs are kept and not measured again;
# --rerun moves this machine's earlier records aside first. The report is results/report.md
# (results/smoke/report.md for smoke).
set -euo pipefail
cd "$(dirname "$0")"
profile="" only="" rerun=0
while [ $# -gt 0 ]; do
  case "$1" in
    --profile) profile="${2:?--profile needs smoke, quick or full}"; shift 2 ;;
    --only) only="${2:?--only needs a comma-separated list of experiments}"; shift 2 ;;
    --rerun) rerun=1; shift ;;
    # the comment block at the top, without its "# " (it ends at the first line that is not a comment)
    -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
    *) echo "run_all.sh: unknown argument '$1'; allowed: --profile smoke|quick|full, --only LIST, --rerun" >&2; exit 2 ;;
  esac
done
case "$profile" in
  ""|smoke|quick|full) ;;
  *) echo "run_all.sh: --profile '$profile' is not allowed; choose smoke, quick or full" >&2; exit 2 ;;
esac
source scripts/env.sh
default_results=results
[ "$profile" = smoke ] && default_results=results/smoke
export DDPBENCH_RESULTS="${DDPBENCH_RESULTS:-$default_results}"
export DDPBENCH_MACHINE="${DDPBENCH_MACHINE:-$(python -c 'from experiments.core.machine import machine_name; print(machine_name())')}"
out="$DDPBENCH_RESULTS/runs/$DDPBENCH_MACHINE"
if [ "$rerun" = 1 ] && [ -d "$out" ]; then
  mv "$out" "$out.previous-$(date +%Y%m%dT%H%M%S)"
  echo "ddpbench: earlier records moved aside"
fi
status=0
python -m experiments main-job ${profile:+--profile "$profile"} ${only:+--only "$only"} --out-dir "$out" || status=$?
[ "$status" = 2 ] && exit 2
python -m analysis.report
echo "ddpbench: records in $out; report in $DDPBENCH_RESULTS/report.md"
exit "$status"
