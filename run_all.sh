#!/usr/bin/env bash
# The main job. For now: ddp_core against PyTorch's DDP on ResNet50 and BERT-base, side by side
# (benchmarks/ddp_core_vs_torch.py), stored under results/benchmarks/. Takes about 15 minutes on
# 2 CPU cores. Extra arguments go to the benchmark, e.g. ./run_all.sh --models resnet-tiny --rounds 2
set -euo pipefail
cd "$(dirname "$0")"
source scripts/env.sh
machine="$(uname -m)-$(nproc)cpu"
if python -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  machine="$machine-$(python -c 'import torch; print(torch.cuda.get_device_name(0).replace(" ", "_"))')"
fi
out="results/benchmarks/ddp_core_vs_torch-$machine.json"
python benchmarks/ddp_core_vs_torch.py --out "$out" "$@"
echo "ddpbench: results in $out"
