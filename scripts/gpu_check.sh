#!/usr/bin/env bash
# Every GPU check and measurement in one call, for a lent GPU machine (issue 6); meant to end within
# 10 minutes on one H200. It uses that machine's own python3 (which has torch, transformers, pandas,
# scipy and pytest) rather than scripts/env.sh, since nothing can be installed there.
#
#   OUT=/some/folder scripts/gpu_check.sh      # writes gpu.log, runs.jsonl, profile.jsonl (with interference
#                                              # probes), allreduce.jsonl, interference.jsonl, summary.txt
#
# Each step has its own time limit; a failed step is reported and the others still run.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-results/gpu}"
mkdir -p "$out"
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
py="${PYTHON:-python3}"
log="$out/gpu.log"
: >"$out/summary.txt"

step() {  # step NAME LIMIT_SECONDS COMMAND...
  local name=$1 limit=$2 start status
  shift 2
  start=$(date +%s)
  echo "== $name: $*" >>"$log"
  timeout "$limit" "$@" >>"$log" 2>&1
  status=$?
  printf '%-28s exit %3d  %4d s\n' "$name" "$status" "$(($(date +%s) - start))" | tee -a "$out/summary.txt"
}

# (an array, not a shell function: `timeout` starts programs, and a function is none)
run=("$py" -m experiments run --device cuda --out "$out/runs.jsonl" --timeout 150)

if ! "$py" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
  echo "gpu_check.sh: needs a CUDA GPU and a python ($py) with torch that sees it; none here" >&2
  exit 2
fi

nvidia-smi -L >>"$log" 2>&1
"$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))' >>"$log" 2>&1
step gpu_tests 110 "$py" -m pytest -q -m gpu tests/integration/test_gpu.py -p no:cacheprovider
# ddp_core against PyTorch's DDP: NCCL at world size 1, and Gloo on CUDA tensors at world size 2 (one GPU)
step resnet50_nccl_ws1 60 "${run[@]}" --backend nccl --world-size 1 --model resnet50 --impl ddp_core,ddp_core_no_overlap,torch \
  --image-size 224 --batch-size 32 --iters 20 --warmup 5
step bert_nccl_ws1 60 "${run[@]}" --backend nccl --world-size 1 --model bert-base --impl ddp_core,ddp_core_no_overlap,torch \
  --seq-len 128 --batch-size 16 --iters 20 --warmup 5
step gloo_cuda_ws2 80 "${run[@]}" --backend gloo --world-size 2 --model resnet50,bert-base --impl ddp_core,torch \
  --image-size 224 --seq-len 128 --batch-size 16 --iters 10 --warmup 3
# the performance model's one-process profiles (issue 5) at the paper's input sizes; each also probes its
# model's interference (issue 29: backward alone and beside an NCCL all-reduce of its gradient bytes; on a
# machine with one GPU a world of one, whose all-reduce moves no data between ranks: a lower bound)
step profile_resnet50 60 "$py" -m experiments profile --device cuda --model resnet50 --image-size 224 --batch-size 32 \
  --iters 20 --warmup 5 --out "$out/profile.jsonl"
step profile_bert 60 "$py" -m experiments profile --device cuda --model bert-base --seq-len 128 --batch-size 16 \
  --iters 20 --warmup 5 --out "$out/profile.jsonl"
# Interference where the all-reduce moves data on one GPU: 2 ranks with Gloo on CUDA tensors (staged through
# host memory: copies that share the GPU's memory bandwidth with backward); NCCL refuses 2 ranks on 1 GPU.
step interference_gloo_cuda 60 "$py" -c '
import sys
from pathlib import Path
from experiments.perfmodel.interference import InterferenceConfig, run_probes
for model, inputs in (("resnet50", {"image_size": 224, "batch_size": 32}), ("bert-base", {"seq_len": 128, "batch_size": 16})):
    run_probes([InterferenceConfig(model=model, backend="gloo", device="cuda", world_size=2, threads=1,
                                   **{"image_size": 224, "seq_len": 128, **inputs})], Path(sys.argv[1]), timeout=50)
' "$out/interference.jsonl"
# all-reduce microbenchmarks at the sizes a communication model is fitted to
step allreduce_nccl 40 "$py" -m experiments allreduce --backend nccl --device cuda --world-size 1 \
  --per-call 1000000,10000000,60000000 --reps 5 --out "$out/allreduce.jsonl"
step allreduce_gloo_cuda 60 "$py" -m experiments allreduce --backend gloo --device cuda --world-size 2 \
  --per-call 100000,1000000,10000000,60000000 --reps 3 --out "$out/allreduce.jsonl"

"$py" - "$out" <<'PY' | tee -a "$out/summary.txt"
import sys
from pathlib import Path
from experiments.core.records import read_records
from experiments.core.stats import phase_medians
out = Path(sys.argv[1])
for name in ("runs.jsonl", "profile.jsonl", "allreduce.jsonl", "interference.jsonl"):
    path = out / name
    if not path.exists():
        print(f"{name}: no records")
        continue
    for r in read_records(path):
        c = r["config"]
        if r["status"] != "ok":
            print(f"FAILED {c}: {r['error'].splitlines()[-1]}")
        elif r["kind"] == "run":
            b = phase_medians(r["phases_s"], c["sync_every"])
            comm = "-" if b["exposed_comm"] is None else f"{b['exposed_comm'] * 1e3:.1f}"
            print(f"{c['model']:10} {c['impl']:20} {c['backend']:5} ws{c['world_size']} "
                  f"p50 {r['summary']['p50'] * 1e3:8.2f} ms  fwd {b['forward'] * 1e3:.1f} bwd {b['backward'] * 1e3:.1f} "
                  f"comm {comm} opt {b['optimizer'] * 1e3:.1f}  correct={r['correct']}")
        elif r["kind"] == "interference":
            from experiments.perfmodel.interference import from_record
            print(f"interference {c['model']:10} {c['backend']:5} ws{c['world_size']} {from_record(r).describe()}")
        elif r["kind"] == "profile":
            s = r["summary"]
            print(f"profile {c['model']:10} ws1 p50 {s['p50'] * 1e3:8.2f} ms  fwd {s['forward'] * 1e3:.1f} "
                  f"bwd {s['backward'] * 1e3:.1f} tail {s['tail'] * 1e3:.1f} opt {s['optimizer'] * 1e3:.1f}")
        else:
            s = r["summary"]
            print(f"allreduce {c['backend']:5} ws{c['world_size']} {c['mode']:11} {c['elements']:>9} el/call "
                  f"p50 {s['p50']*1e3:9.3f} ms busbw {s['busbw_GBps']:7.2f} GB/s wrong={r['wrong']}")
PY
