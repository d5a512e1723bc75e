#!/bin/bash
# Issue 29's interference term, re-measured in one short session on this shared 2-core machine (docs:
# performance-model.md "Interference"):
#   bash benchmarks/interference_validation/measure.sh [OUT]   (default results/interference)
# Each part writes records under OUT (the reference machine's: results/reference/x86_64-2cpu/interference/):
#   allreduce - this machine's all-reduce at 2 ranks on loopback, 1 KiB to 256 MiB: the fit link and vit predict with
#   probes  - interference probes of ResNet50 and BERT-base at the main job's quick inputs (the stored runs'
#             models), for re-predicting the stored loopback and 2.5/5 Gbit/s link runs (no run repeated)
#   link    - a fresh subset in one session: profiles of 2 co-located copies (+ their probes), then E2 at
#             2.5 Gbit/s on 2 emulated hosts (ResNet50, BERT-base; overlap on and off; needs root)
#   vit     - advise for ViT-B/16 (the issue's 29% case; it runs its probe) and the runs it predicts
#   order   - ViT-B/16's two runs in either order: whether the gap between overlap and none is the configs' or their
#             order's (the first config of fresh ranks ran slower until sweeps ran it once unrecorded first)
# Then: python benchmarks/interference_validation/table.py OUT > OUT/table.md
set -e
OUT=$(realpath -m "${1:-${OUT:-results/interference}}")
cd "$(dirname "$0")/../.."
FIT=${FIT:-$OUT/allreduce.jsonl}   # measured in the same session (a fit from another day misses by 10-20%)
PARTS=${PARTS:-"allreduce probes link vit order"}
QUICK="--image-size 32 --seq-len 16 --batch-size 2 --threads 1"
mkdir -p $OUT
load() { echo "$(date -u +%FT%TZ) $1: $(cut -d' ' -f1-3 /proc/loadavg) (load average 1/5/15 min)" | tee -a $OUT/load.txt; }
for part in $PARTS; do
  load "$part start"
  case $part in
    allreduce)
      rm -f $OUT/allreduce.jsonl
      ./ddpbench allreduce --mode size --world-size 2 --out $OUT/allreduce.jsonl
      ;;
    probes)
      # (python -c, not a script on stdin: the ranks re-import the main module, which stdin cannot give)
      python -c '
import sys
from pathlib import Path
from experiments.perfmodel.interference import InterferenceConfig, run_probes
run_probes([InterferenceConfig(model=m, backend="gloo", device="cpu", world_size=2, threads=1, batch_size=2,
                               image_size=32, seq_len=16, rounds=7) for m in ("resnet50", "bert-base")],
           Path(sys.argv[1]))
' $OUT/probes.jsonl
      ;;
    link)
      ./ddpbench profile --model resnet50,bert-base $QUICK --colocated 2 --iters 10 --warmup 2 --out $OUT/link/profile.jsonl
      ./ddpbench run --model resnet50,bert-base $QUICK --world-size 2 --link 2.5gbit \
          --impl ddp_core,ddp_core_no_overlap --iters 12 --warmup 2 --out $OUT/link/runs.jsonl
      ;;
    vit)
      ./ddpbench advise --model torchvision:vit_b_16 --image-size 32 --batch-size 4 --world-size 2 --allreduce $FIT \
          --out $OUT/vit/vit_b_16
      ./ddpbench run --model torchvision:vit_b_16 --image-size 32 --batch-size 4 --world-size 2 \
          --impl ddp_core,ddp_core_no_overlap --out $OUT/vit/runs.jsonl
      ;;
    order)
      # (vit/order_before_settling.jsonl: `--impl ddp_core_no_overlap,ddp_core --warmup 15` before a fresh pool ran
      # its first job once unrecorded - the first config took 709 ms, the second 535)
      for impls in ddp_core,ddp_core_no_overlap ddp_core_no_overlap,ddp_core; do
        ./ddpbench run --model torchvision:vit_b_16 --image-size 32 --batch-size 4 --world-size 2 \
            --impl $impls --out $OUT/vit/order_${impls%%,*}_first.jsonl
      done
      ;;
  esac
  load "$part end"
done
