#!/bin/bash
# docs/trace.md's validation of `predict --trace` on this machine:
#   bash benchmarks/trace_validation/measure.sh [OUT]   (OUT: the raw files' folder, default results/trace)
# in parts (PARTS; default all, in this order):
#   allreduce - this machine's all-reduce at 2 ranks on loopback, 1 KiB to 256 MiB: the fit the predictions use
#   loopback - trace the example loop in one process (alone, and beside a second copy as two ranks sharing
#              this host) and measure the same model at world size 2 (`ddpbench run`; the loop the harness
#              lacks - clipping and 2 micro-batches per step - by running that loop itself under torch's DDP)
#   link     - the same model at world size 2 on 2 emulated hosts behind a 2.5 Gbit/s link (`run --link`)
#   scale    - each trace read as a profile (`scale-profile --trace`) drives the scale model at 4-16 ranks on
#              emulated hosts (compute replayed as traced, time dilated); table.py has the model predict them
#   probe    - this machine's interference term, probed on two models that are not among the cases
#              (ResNet50 and BERT-base at the main job's quick inputs)
#   predict  - every trace predicts world size 2 on loopback and over the link with this machine's
#              all-reduce fit, without the interference term and with the probe's (cheap: re-run it alone)
#   runs     - the loopback and link parts' `ddpbench run` measurements only, without tracing again (to re-measure
#              after a change to how runs are measured; the traces and predictions stay)
# Then: python benchmarks/trace_validation/table.py OUT > OUT/table.md (the reference copy: results/reference/x86_64-2cpu/trace/)
set -e
OUT=$(realpath -m "${1:-${OUT:-results/trace}}")  # raw files (results/ is ignored by git); table.py turns them into table.md
cd "$(dirname "$0")/../.."
FIT=${FIT:-$OUT/allreduce.jsonl}  # measured by the allreduce part, in the same session as the runs it predicts
PARTS=${PARTS:-"allreduce loopback link scale probe predict"}
# name | --model | the loop's and the run's inputs | the run's --model-config
CASES=${CASES:-"mine|examples/my_model.py|--image-size 32 --batch-size 8|
resnet18|torchvision:resnet18|--image-size 32 --batch-size 8|num_classes=10
mobilenet_v2|torchvision:mobilenet_v2|--image-size 32 --batch-size 8|num_classes=10
efficientnet_b0|torchvision:efficientnet_b0|--image-size 32 --batch-size 8|num_classes=10
gpt2|transformers:gpt2|--seq-len 32 --batch-size 2|
opt|transformers:opt|--seq-len 32 --batch-size 2|"}
# --world-size | --ranks-per-host | --link | --time-dilation: the scale model's runs of each traced model, on the
# main job's cluster (8 ranks per host, 100 Gbit/s between hosts), and 10 Gbit/s links, where communication
# weighs more (2 hosts of 2 ranks, 2 of 8). K is lower than the main job's 50-100, which
# are for V100 compute (63 ms); a trace's CPU compute is 2-15x longer, so a smaller K leaves the cores as idle
# (each record's timing.cores_busy says; table.py shows it)
SCALE=${SCALE:-"4|4|100gbit|10
8|8|100gbit|20
16|8|100gbit|40
4|2|10gbit|10
16|8|10gbit|40"}
mkdir -p $OUT
load() { echo "$(date -u +%FT%TZ) $1: $(cut -d' ' -f1-3 /proc/loadavg) (load average 1/5/15 min)" | tee -a $OUT/load.txt; }
config() { [[ -n $1 ]] && echo "--model-config $1"; true; }
measure_loopback() {
  ./ddpbench run --model $model $(config "$cfg") $inputs --world-size 2 --iters 20 --warmup 3 \
      --out $OUT/$name.run.jsonl 2>&1 | tail -1
}
measure_link() {
  ./ddpbench run --model $model $(config "$cfg") $inputs --world-size 2 --link 2.5gbit --iters 12 --warmup 2 \
      --out $OUT/$name.link.run.jsonl 2>&1 | tail -1
}

for part in $PARTS; do
  load "$part start"
  while IFS='|' read -r -u 3 name model inputs cfg; do  # (fd 3: the commands inside may read stdin)
    [[ -z $name ]] && continue
    loop="python examples/trace_my_loop.py --model $model $inputs"
    case $part in
      loopback)
        $loop --out $OUT/$name.json 2>/dev/null
        $loop --colocated 2 --out $OUT/${name}_x2.json 2>/dev/null
        measure_loopback
        ;;
      link)
        measure_link
        ;;
      runs)
        rm -f $OUT/$name.run.jsonl $OUT/$name.link.run.jsonl
        measure_loopback
        measure_link
        ;;
      scale)
        rm -f $OUT/scale/$name.profile.jsonl
        ./ddpbench scale-profile --trace $OUT/$name.json --model $model $(config "$cfg") $inputs \
            --out $OUT/scale/$name.profile.jsonl
        while IFS='|' read -r -u 4 ranks per_host link dilation; do
          # a stand-in holds 3 copies of the gradients: a 500 MB language model stops at 4 ranks (24 GB here)
          [[ $model == transformers:* && $ranks -gt 4 ]] && continue
          ./ddpbench run --model $model $(config "$cfg") $inputs --world-size $ranks --ranks-per-host $per_host \
              --link $link --compute emulated --compute-profile $OUT/scale/$name.profile.jsonl \
              --time-dilation $dilation --iters 4 --warmup 2 --out $OUT/scale/$name.runs.jsonl 2>&1 | tail -1
        done 4<<< "$SCALE"
        ;;
      predict)
        for t in $name ${name}_x2 $([[ $name == mine ]] && echo mine_acc mine_acc_x2); do
          for net in "" .link; do
            for term in none $OUT/probes.jsonl; do
              ./ddpbench predict --trace $OUT/$t.json --model $t --allreduce $FIT ${net:+--link 2.5gbit} \
                  --interference $term --world-size 2 --json > $OUT/$t$net$([[ $term == none ]] || echo .term).predict.json
            done
          done
        done
        ;;
    esac
  done 3<<< "$CASES"
  if [[ $part == loopback ]]; then
    # A loop the harness lacks: gradient clipping and 2 micro-batches per optimizer step, measured as itself.
    loop="python examples/trace_my_loop.py --model examples/my_model.py --image-size 32 --batch-size 8 --clip 1.0 --accumulate 2"
    $loop --out $OUT/mine_acc.json 2>/dev/null
    $loop --colocated 2 --out $OUT/mine_acc_x2.json 2>/dev/null
    $loop --world-size 2 --steps 23 2>/dev/null | tee $OUT/mine_acc.ddp.txt
  fi
  if [[ $part == allreduce ]]; then
    rm -f $OUT/allreduce.jsonl
    ./ddpbench allreduce --mode size --world-size 2 --out $OUT/allreduce.jsonl 2>&1 | tail -1
  fi
  if [[ $part == probe ]]; then
    rm -f $OUT/probes.jsonl
    python -c '
import sys
from pathlib import Path
from experiments.perfmodel.interference import InterferenceConfig, run_probes
run_probes([InterferenceConfig(model=m, backend="gloo", device="cpu", world_size=2, threads=1, batch_size=2,
                               image_size=32, seq_len=16) for m in ("resnet50", "bert-base")], Path(sys.argv[1]))
' $OUT/probes.jsonl
  fi
  if [[ $part == scale ]]; then
    # the scale model's hosts talk over this machine's loopback: its all-reduce at 2-16 ranks (the main job's)
    cp results/reference/x86_64-2cpu/runs/x86_64-2cpu/scale_loopback.jsonl $OUT/scale/
  fi
  load "$part end"
done
