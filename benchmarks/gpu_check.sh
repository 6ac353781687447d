#!/usr/bin/env bash
# One short GPU check (≤ 8 minutes on one H200): Triton loss vs reference, fused vs eager timings and memory,
# fp16/bf16 vs fp32 encoding, a large-batch GradCache step, and fp16 passages/s against sentence-transformers with
# fp16 weights. Uses the machine's own torch/triton/transformers/sentence-transformers and the source tree as is
# (the C++ index is not needed here).
#   bash benchmarks/gpu_check.sh RESULTS_DIR
set -euo pipefail
out=${1:?usage: gpu_check.sh RESULTS_DIR}
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
unset TRITON_INTERPRET
timeout 470 python3 benchmarks/gpu_check.py "$out"
