#!/usr/bin/env bash
# The GPU figures of issue 16 in one short run (budget 7 minutes; about 5 on one H200).
#   bash benchmarks/gpu.sh OUT_DIR [extra benchmarks/gpu.py options]
# Needs the repository installed (pip install -e .) and a CUDA build of torch; downloads nothing.
# Writes OUT_DIR/gpu.json (and prints one line per section). CPU check of every code path:
#   python benchmarks/gpu.py --out /tmp/gpu-dry --device cpu --dry-run
set -euo pipefail
out="${1:?usage: bash benchmarks/gpu.sh OUT_DIR [options]}"
shift
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv > "$out/nvidia-smi.csv" 2>/dev/null || true
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
timeout 480 python "$here/gpu.py" --out "$out" --device cuda --budget-s 400 "$@" 2>&1 | tee "$out/gpu.log"
