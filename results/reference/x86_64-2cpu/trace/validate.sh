#!/bin/bash
# docs/trace.md's validation: trace the example loop in one process (alone, and beside a second copy as
# two ranks sharing this host), predict world size 2 on loopback with this machine's all-reduce fit, and
# measure the same model at world size 2 (ddpbench run; the loop the harness lacks: itself under torch DDP).
# Then: python results/reference/x86_64-2cpu/trace/table.py results/trace
set -e
OUT=${OUT:-results/trace}  # raw files (ignored by git); table.py turns them into table.md
FIT=results/reference/x86_64-2cpu/runs/x86_64-2cpu
CASES=${CASES:-"mine:examples/my_model.py resnet18:torchvision:resnet18 mobilenet_v2:torchvision:mobilenet_v2"}
mkdir -p $OUT
for case in $CASES; do
  name=${case%%:*}; model=${case#*:}
  loop="python examples/trace_my_loop.py --model $model --image-size 32 --batch-size 8"
  $loop --out $OUT/$name.json 2>/dev/null
  $loop --colocated 2 --out $OUT/${name}_x2.json 2>/dev/null
  for t in $name ${name}_x2; do
    ./ddpbench predict --trace $OUT/$t.json --model $t --allreduce $FIT --world-size 2 --json > $OUT/$t.predict.json
  done
  cfg=""; [[ $model == torchvision:* ]] && cfg="--model-config num_classes=10"
  ./ddpbench run --model $model $cfg --image-size 32 --batch-size 8 --world-size 2 --iters 20 --warmup 3 \
      --out $OUT/$name.run.jsonl 2>&1 | tail -1
done
# A loop the harness lacks: gradient clipping and 2 micro-batches per optimizer step.
loop="python examples/trace_my_loop.py --model examples/my_model.py --image-size 32 --batch-size 8 --clip 1.0 --accumulate 2"
$loop --out $OUT/mine_acc.json 2>/dev/null
$loop --colocated 2 --out $OUT/mine_acc_x2.json 2>/dev/null
for t in mine_acc mine_acc_x2; do
  ./ddpbench predict --trace $OUT/$t.json --model $t --allreduce $FIT --world-size 2 --json > $OUT/$t.predict.json
done
$loop --world-size 2 --steps 23 2>/dev/null | tee $OUT/mine_acc.ddp.txt
